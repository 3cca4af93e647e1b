"""The muser ops inside ops.use_backend("metal-emulator"): the CPU dispatch hands CPU tensors
to ops/metal, which runs the .metal kernels through the emulator."""
from __future__ import annotations

import pytest
import torch

import muser_torch.ops as ops
from muser_torch import GGMLType
from muser_torch.arch.spec import LLAMA_CPP_TYPES
from muser_torch.ops import metal

from .helpers import SHAPE_OF, fresh_seed, random_weights, reference, rel_err

pytestmark = pytest.mark.usefixtures("emulate")


def test_ops_route_through_the_emulator(monkeypatch):
    seed = fresh_seed()
    qtype = GGMLType.NVFP4_E2M1                           # companions travel too
    n_out, n_in = SHAPE_OF[qtype]
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed)
    ran = []
    kernel = metal._kernel
    monkeypatch.setattr(metal, "_kernel", lambda d, n, op: ran.append(n) or kernel(d, n, op))
    x = torch.randn(3, n_in, generator=torch.Generator().manual_seed(seed))
    y = ops.qmatmul(x, packed, qtype, n_out, n_in, scales, scale_2)
    w = reference(packed, qtype, n_in, scales, scale_2)
    assert rel_err(y, x.double() @ w.double().T) < 1e-5, f"seed {seed}"
    ids = torch.tensor([[0, n_out - 1]], dtype=torch.int32)
    assert torch.equal(ops.embedding(ids, packed, qtype, n_out, n_in, scales, scale_2), w[ids.long()])
    assert torch.equal(ops.dequantize(packed, qtype, n_out, n_in, scales, scale_2), w)
    assert ran == ["muser_ext_nvfp4_e2m1", "muser_embed_nvfp4_e2m1", "muser_dequant_nvfp4_e2m1"]


def test_opcheck_qmatmul_emulated():
    seed = fresh_seed()
    qtype = GGMLType.Q5_K
    n_out, n_in = SHAPE_OF[qtype]
    packed, _, _ = random_weights(qtype, n_out, n_in, seed)
    x = torch.randn(2, n_in, generator=torch.Generator().manual_seed(seed))
    torch.library.opcheck(torch.ops.muser.qmatmul.default, (x, packed, int(qtype), n_out, n_in, None, None))


# llama.cpp's NVFP4, and the llama.cpp types the loaders admit that Metal does not run yet
OUTSIDE_METAL = [GGMLType.NVFP4] + sorted(LLAMA_CPP_TYPES - metal.SUPPORTED)


@pytest.mark.parametrize("qtype", OUTSIDE_METAL, ids=lambda t: t.name)
def test_emulate_mode_keeps_the_fence_for_other_types(qtype):
    n_in = qtype.block_elems
    packed = torch.zeros(4, qtype.row_bytes(n_in), dtype=torch.uint8)
    with pytest.raises(ValueError, match=f"{qtype.name} has no Metal kernel"):
        ops.qmatmul(torch.zeros(1, n_in), packed, qtype, 4, n_in)
