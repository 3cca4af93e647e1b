"""Random packed weights and float64 references for the Metal kernel tests.

Shared by test_kernels.py (emulated) and test_mps.py (real MPS). Every call
draws fresh data from a seed the test reports in its assertion messages."""
from __future__ import annotations

import torch

from muser_torch import GGMLType
from muser_torch.formats import dequantize_reference as ref_dequantize
from muser_torch.formats import random_weight
from muser_torch.ops.metal import SUPPORTED

from ...random_seed import fresh_seed  # noqa: F401 (its tests import it from here)

# (n_out, n_in) per type: n_out never a multiple of the 4 rows of an mv
# threadgroup or the 32 of an mm tile; most n_in leave a partial 64-wide K step.
SHAPE_OF = {
    GGMLType.Q4_K: (37, 512), GGMLType.Q5_K: (13, 256), GGMLType.Q6_K: (7, 512),
    GGMLType.NVFP4_E2M1: (13, 208), GGMLType.F16: (7, 80), GGMLType.BF16: (7, 80),
    GGMLType.Q4_0: (11, 96), GGMLType.Q4_1: (9, 160), GGMLType.Q5_0: (13, 224), GGMLType.Q5_1: (7, 288),
    GGMLType.Q8_0: (19, 96),
    GGMLType.Q2_K: (11, 512), GGMLType.Q3_K: (9, 256),
    GGMLType.IQ4_NL: (11, 160), GGMLType.IQ4_XS: (13, 512), GGMLType.MXFP4: (9, 224),
    GGMLType.IQ3_XXS: (9, 512), GGMLType.IQ3_S: (11, 256),
}
# The tests sweep exactly ops.metal.SUPPORTED (a type without a shape above fails here).
SHAPES = [(t, *SHAPE_OF[t]) for t in sorted(SUPPORTED)]
IDS = [f"{t.name}-{o}x{i}" for t, o, i in SHAPES]
TOKEN_COUNTS = (1, 2, 3, 4, 5, 8, 9, 16, 17, 64)


def random_weights(qtype: GGMLType, n_out: int, n_in: int, seed: int, device="cpu"):
    """(packed, scales, scale_2) with finite, varied values (``formats.random_weight``);
    scales/scale_2 are None except for NVFP4_E2M1."""
    w = random_weight(qtype, n_out, n_in, generator=torch.Generator().manual_seed(seed)).to(device)
    return w.packed, w.scales, w.scale_2


def reference(packed, qtype, n_in, scales, scale_2) -> torch.Tensor:
    """float32 W from the CPU reference (bit-exact with gguf)."""
    return ref_dequantize(packed.cpu(), qtype, n_in,
                          scales=None if scales is None else scales.cpu(),
                          scale_2=None if scale_2 is None else scale_2.cpu())


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    y, ref = y.cpu().double(), ref.cpu().double()   # MPS has no float64
    return float((y - ref).norm() / ref.norm().clamp_min(1e-300))


def swap_first_two_blocks(packed: torch.Tensor, blocks_per_row: int) -> torch.Tensor:
    """``packed`` with each row's first two blocks swapped, scales and codes:
    what a wrong block stride or a swapped scale reads (the planted defect of
    the bounds against float64)."""
    size = packed.shape[1] // blocks_per_row
    bad = packed.clone()
    bad[:, :size], bad[:, size:2 * size] = packed[:, size:2 * size], packed[:, :size]
    return bad
