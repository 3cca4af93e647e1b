"""The llama-family architectures on CUDA give the CPU's numbers: float32
activations (the Triton float rungs and the layer ops' kernels in IEEE
float32, held to the 1e-5 contract), the full forward, a cached greedy
continuation, and float16 activations (the serving dtype) within half
precision of the CPU's float32 logits. Skips without a GPU."""
from __future__ import annotations

import pytest
import torch

import muser_torch

from .hf_files import ARCHS, write_random_gguf

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("arch", ARCHS)
def test_cuda_matches_cpu(tmp_path, arch):
    seed = 11
    path = write_random_gguf(tmp_path / f"{arch}.gguf", arch, seed=seed, n_layers=3)
    gen = torch.Generator().manual_seed(seed)
    cpu = muser_torch.from_gguf(path, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, cpu.config.vocab_size, (2, 40), generator=gen)
    with torch.no_grad():
        want = cpu(ids).float()
    cpu.setup_cache(1, 128)
    want_greedy = cpu.generate(ids[0], max_new_tokens=16)
    for dtype, bound in ((torch.float32, 1e-5), (torch.float16, 2e-2)):
        model = muser_torch.from_gguf(path, device="cuda", dtype=dtype)
        with torch.no_grad():
            got = model(ids.cuda()).float().cpu()
        assert _rel(got, want) < bound, f"{arch} {dtype}: seed {seed}"
        if dtype == torch.float32:
            model.setup_cache(1, 128)
            assert torch.equal(model.generate(ids[0].cuda(), max_new_tokens=16).cpu(), want_greedy)
