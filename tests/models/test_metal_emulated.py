"""The MPS code path of every architecture, run through the Metal emulator on
small files: the same logits as the CPU path (prefill and cached decode),
and every projection really went through a .metal kernel.

On a Mac the same model would run these kernels on the GPU; here the
emulator runs their unmodified source (docs/metal.md)."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch import ops
from muser_torch.ops import metal

from .conftest import SEED, rel_err
from .family_files import ARCH_VARIANTS, hf_file, tokens  # noqa: F401  (fixtures)
from .test_gemma3_admission import SMALL, write
from ..bounds import check_bound


def _compare(model, vocab: int, monkeypatch) -> None:
    used: set[str] = set()
    kernel = metal._kernel

    def spy(device, name, op):
        used.add(name.split("_")[1])      # muser_<rung>_<type>
        return kernel(device, name, op)

    monkeypatch.setattr(metal, "_kernel", spy)
    ids = tokens(vocab, 12, salt=11)
    with torch.no_grad():
        want = model(ids)
        model.setup_cache(1, 16)
        slots = torch.zeros(1, dtype=torch.long)
        want_step = torch.cat([model(ids[:, :10], slots)[:, -1:], model(ids[:, 10:11], slots),
                               model(ids[:, 11:], slots)], 1)
        with ops.use_backend("metal-emulator"):
            got = model(ids)
            model.reset()
            got_step = torch.cat([model(ids[:, :10], slots)[:, -1:], model(ids[:, 10:11], slots),
                                  model(ids[:, 11:], slots)], 1)
    for what, a, b in (("prefill", got, want), ("cached decode", got_step, want_step)):
        err = rel_err(a, b)
        check_bound("emulated MPS against CPU: rel err", err, 1e-5, f"{what}: emulated MPS logits differ from CPU by {err:.2e} (seed {SEED})")
    # 12 and 10 tokens take the mm rung, 1 token the mv rung; the embedding its own kernel
    assert {"mm", "mv", "embed"} <= used, f"the emulated path ran only {sorted(used)}"


@pytest.mark.parametrize("variant", ARCH_VARIANTS)
def test_llama_family_emulated_mps_matches_cpu(hf_file, variant, monkeypatch):  # noqa: F811
    # (one schedule here: tests/ops/metal runs every kernel under all three)
    model = muser_torch.from_gguf(hf_file(variant), dtype=torch.float32)
    _compare(model, model.config.vocab_size, monkeypatch)


def test_gemma3_emulated_mps_matches_cpu(tmp_path, monkeypatch):
    model = muser_torch.from_gguf(write(tmp_path / "small.gguf"), dtype=torch.float32)
    _compare(model, SMALL.vocab_size, monkeypatch)
