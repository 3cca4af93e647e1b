"""The layer ops (``ops/layer.py``) as ops: schemas, fake kernels and
mutation declarations pass ``torch.library.opcheck`` (the default
implementation, the composite, runs here), and bad arguments are refused
with a one-line ValueError naming the op. The CUDA kernels against float64:
tests/ops/cuda/test_layer.py."""
from __future__ import annotations

import math

import pytest
import torch

from muser_torch.ops import layer as layer_ops  # noqa: F401  (defines the ops)


def _args(op: str, gen: torch.Generator) -> tuple:
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    B, T, H, D, S = 2, 1, 2, 8, 12
    ang = torch.rand(B, T, 1, D // 2, generator=gen)
    return {
        "rms_norm": (r(3, 16), r(16), 1e-6),
        "add_rms_norm": (r(3, 16), r(3, 16), r(16), 1e-8, r(16), 1e-6),
        "norm_rope": (r(B, T, H, D), r(D), 1e-6, ang.cos(), ang.sin(), layer_ops.ROPE_NORMAL),
        "decode_attention": (r(B, H, 3, D), r(B, S, H, D), r(B, S, H, D),
                             torch.rand(B, 1, 3, S, generator=gen) < 0.8, 1 / math.sqrt(D),
                             torch.full((B,), S, dtype=torch.long)),
        "kv_store": (r(3, 6, H, D), r(3, 6, H, D), torch.tensor([2, 0]),
                     torch.tensor([[4], [9]]), r(B, 1, H, D), r(B, 1, H, D)),
        "decode_mask": (torch.tensor([0, 7, 30]), 8, 5),
        "gated_act": (r(3, 16), r(3, 16), layer_ops.ACT_GELU_TANH),
    }[op]


@pytest.mark.parametrize("op", sorted(layer_ops.REFERENCES))
def test_opcheck(op):
    args = _args(op, torch.Generator().manual_seed(7))
    if op == "decode_attention":
        args[3][..., 0] = True       # every row sees a key
    torch.library.opcheck(getattr(torch.ops.muser, op), args)


@pytest.mark.parametrize("op,bad,match", [
    ("rms_norm", (torch.ones(3, 4, dtype=torch.int32), torch.ones(4), 1e-6), "x must be a float"),
    ("rms_norm", (torch.ones(3, 4), torch.ones(5), 1e-6), "weight must be"),
    ("norm_rope", (torch.ones(1, 1, 1, 4), None, 0.0, torch.ones(1, 1, 1, 2),
                   torch.ones(1, 1, 1, 2), 7), "style must be"),
    ("decode_mask", (torch.tensor([1, 2]), 0, 0), "capacity must be"),
    ("gated_act", (torch.ones(3), torch.ones(4), 0), "up must match"),
])
def test_bad_arguments_are_refused(op, bad, match):
    with pytest.raises(ValueError, match=rf"^muser\.{op}: {match}"):
        getattr(torch.ops.muser, op)(*bad)
