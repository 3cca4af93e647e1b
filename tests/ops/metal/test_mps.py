"""The same checks on real Metal, where torch.backends.mps.is_available()
(skipped elsewhere). The kernels run through the registered "mps" kernels of
the muser ops, compiled by torch.mps.compile_shader.

PyTorch compiles with safe math (fast math only with PYTORCH_MPS_FAST_MATH=1,
which muser refuses). Whether Metal's safe mode still contracts
`scale * q - shift` or `q * d + m` into an fma is not documented; where the
two terms nearly cancel a contraction changes the result by up to an ulp of
the product, so dequantize is held to a tolerance scaled by the matrix's
largest value here instead of the emulator's bit equality."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import muser_torch.ops as ops
from muser_torch import GGMLType

from .helpers import IDS, SHAPES, TOKEN_COUNTS, fresh_seed, random_weights, reference, rel_err

pytestmark = pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an MPS device")
DEMO = Path(__file__).resolve().parents[3] / "demo" / "glimmer-demo-q4_k_xl.gguf"


@pytest.mark.parametrize("qtype,n_out,n_in", SHAPES, ids=IDS)
def test_qmatmul_every_rung(qtype, n_out, n_in):
    seed = fresh_seed()
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed, device="mps")
    w = reference(packed, qtype, n_in, scales, scale_2).double()
    g = torch.Generator().manual_seed(seed + 1)
    for n_tok in TOKEN_COUNTS:
        x = torch.randn(n_tok, n_in, generator=g)
        y = ops.qmatmul(x.to("mps"), packed, qtype, n_out, n_in, scales, scale_2)
        torch.mps.synchronize()
        err = rel_err(y, x.double() @ w.T)
        assert err < 1e-5, f"{qtype.name} n_tok={n_tok}: rel err {err:.3g} (seed {seed})"


@pytest.mark.parametrize("qtype,n_out,n_in", SHAPES, ids=IDS)
def test_dequantize_and_embedding(qtype, n_out, n_in):
    seed = fresh_seed()
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed, device="mps")
    want = reference(packed, qtype, n_in, scales, scale_2)
    got = ops.dequantize(packed, qtype, n_out, n_in, scales, scale_2).cpu()
    atol = 1e-6 * float(want.abs().max())
    assert torch.allclose(got, want, rtol=1e-6, atol=atol), f"{qtype.name} (seed {seed})"
    ids = torch.randint(0, n_out, (7,), generator=torch.Generator().manual_seed(seed))
    rows = ops.embedding(ids.to("mps"), packed, qtype, n_out, n_in, scales, scale_2).cpu()
    assert torch.allclose(rows, want[ids], rtol=1e-6, atol=atol), f"{qtype.name} (seed {seed})"


def test_types_outside_the_fence_raise():
    packed = torch.zeros(4, 36, dtype=torch.uint8, device="mps")   # llama.cpp's NVFP4
    with pytest.raises(ValueError, match="NVFP4 has no Metal kernel"):
        ops.qmatmul(torch.zeros(1, 64, device="mps"), packed, GGMLType.NVFP4, 4, 64)


def test_demo_logits_match_cpu():
    from muser_torch.glimmer import Glimmer
    cpu = Glimmer.from_gguf(DEMO, dtype=torch.float32)
    gpu = Glimmer.from_gguf(DEMO, device="mps", dtype=torch.float32)
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    for T in (1, 5, 12):
        tokens = torch.randint(0, cpu.config.vocab_size, (1, T), generator=g)
        err = rel_err(gpu(tokens.to("mps")).cpu(), cpu(tokens))
        assert err < 1e-4, f"T={T}: rel err {err:.3g} (seed {seed})"
