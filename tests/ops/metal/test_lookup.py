"""The lookup-table types' Metal kernels (lookup.metal: IQ4_NL, IQ4_XS,
MXFP4) on ggml's own bytes, through the emulator: ggml's quantizer makes the
weights, gguf-py's numpy decode is the bit-exact reference for dequantize and
embedding, and every qmatmul rung stays within test-backend-ops' MUL_MAT
tolerance (NMSE 5e-4) of ggml's CPU ``mul_mat`` and within 1e-5 of float64.
MXFP4's scale bytes include the subnormal halves (e = 0, 1) and the largest
finite ones."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from muser_torch import GGMLType
from muser_torch.ops import metal

from ...formats.ggml_ref import quantize_chunk
from ..ggml_matmul import ggml_mul_mat
from .helpers import TOKEN_COUNTS, fresh_seed, rel_err
from .llamacpp_mul_mat import GGML_MUL_MAT_NMSE, nmse

pytestmark = pytest.mark.usefixtures("emulate")

LOOKUP = {GGMLType.IQ4_NL: (13, 160), GGMLType.IQ4_XS: (11, 512), GGMLType.MXFP4: (9, 224)}


def _gguf_values(packed: torch.Tensor, qtype: GGMLType, n_in: int) -> torch.Tensor:
    out = gguf.dequantize(packed.numpy(), gguf.GGMLQuantizationType(int(qtype)))
    return torch.from_numpy(np.ascontiguousarray(out)).reshape(packed.shape[0], n_in)


@pytest.mark.parametrize("qtype", list(LOOKUP), ids=lambda t: t.name)
def test_every_rung_against_ggml_mul_mat(qtype):
    n_out, n_in = LOOKUP[qtype]
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n_out, n_in, generator=g) * torch.exp(torch.randn(n_out, 1, generator=g))
    packed = quantize_chunk(w, int(qtype))
    W = _gguf_values(packed, qtype, n_in).double()
    assert torch.equal(metal.dequantize(packed, int(qtype), n_out, n_in), W.float()), f"seed {seed}"
    for n_tok in TOKEN_COUNTS:
        x = torch.randn(n_tok, n_in, generator=g)
        y = metal.qmatmul(x, packed, int(qtype), n_out, n_in)
        rung = metal.rung_for(qtype, n_tok).name
        err = nmse(y, ggml_mul_mat(packed, int(qtype), n_out, n_in, x))
        assert err < GGML_MUL_MAT_NMSE, f"{qtype.name} {rung} n_tok={n_tok}: NMSE {err:.3g} (seed {seed})"
        err = rel_err(y, x.double() @ W.T)
        assert err < 1e-5, f"{qtype.name} {rung} n_tok={n_tok}: {err:.3g} of float64 (seed {seed})"


def test_mxfp4_scale_extremes_decode_bit_exactly():
    """Every E8M0 byte whose values stay finite (up to 252: 12 * 2**124), the
    subnormal halves of 0 and 1 included, in dequantize and embedding."""
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    n_out, n_in = 253, 64
    packed = torch.randint(0, 256, (n_out, n_in // 32 * 17), dtype=torch.uint8, generator=g)
    packed.view(n_out, -1, 17)[:, :, 0] = torch.arange(n_out, dtype=torch.uint8).unsqueeze(1)
    want = _gguf_values(packed, GGMLType.MXFP4, n_in)
    got = metal.dequantize(packed, int(GGMLType.MXFP4), n_out, n_in)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), f"seed {seed}"
    ids = torch.tensor([0, 1, 2, 127, 252])
    rows = metal.embedding(ids, packed, int(GGMLType.MXFP4), n_out, n_in)
    assert torch.equal(rows.view(torch.int32), want[ids].view(torch.int32)), f"seed {seed}"
