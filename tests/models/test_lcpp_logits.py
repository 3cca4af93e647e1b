"""Gemma 3 270M Q4_K_M against llama.cpp's own CPU forward on the same file
(``lcpp_logits``, built by ``shared/tools/peers/build_lcpp_logits.sh``; set
MUSER_LCPP_LOGITS to the binary, else these tests skip).

Both numerics modes must give llama.cpp's 64-token greedy continuation of a
fixed prompt. The last-position logits are compared too and their relative
error printed: issue 22 asks 1e-3 of ``ggml`` mode, which is not reached
(measured 2026-12-02: exact 2.6%, ggml 5.6-6.6%; docs/cpu.md says where the
rest comes from: llama.cpp's f16 KV cache and flash attention, its f16 GELU
table, and its repacked Q4_K kernels), so that bound is not asserted.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

PROMPT = [2, 651, 6037, 3756, 529, 506, 5279, 563, 236743, 8732, 9998, 531, 1586, 532, 7225, 236764]
N_GREEDY = 64


@pytest.fixture(scope="module")
def lcpp(gemma_path):
    binary = os.environ.get("MUSER_LCPP_LOGITS")
    if not binary or not Path(binary).is_file():
        pytest.skip("set MUSER_LCPP_LOGITS to llama.cpp's lcpp_logits binary")
    out = subprocess.run([binary, gemma_path, "1", str(N_GREEDY), *map(str, PROMPT)],
                         capture_output=True, text=True, timeout=600, check=True).stdout
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.splitlines() if ln.strip()}
    logits = torch.tensor([float(v) for v in lines["LOGITS"]], dtype=torch.float64)
    return logits, [int(v) for v in lines["GREEDY"]]


@pytest.mark.parametrize("numerics", ["exact", "ggml"])
def test_same_greedy_continuation_as_llama_cpp(numerics, gemma_path, lcpp):
    import muser_torch
    ref_logits, ref_greedy = lcpp
    model = muser_torch.from_gguf(gemma_path, dtype=torch.float32, numerics=numerics)
    model.setup_cache(1, len(PROMPT) + N_GREEDY + 1)
    slots = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        logits = model(torch.tensor([PROMPT]), slots)[0, -1].double()
        tokens = [int(logits.argmax())]
        for _ in range(N_GREEDY - 1):
            tokens.append(int(model(torch.tensor([[tokens[-1]]]), slots)[0, -1].argmax()))
    err = float((logits - ref_logits).norm() / ref_logits.norm())
    print(f"{numerics}: last-position logits {err:.3g} relative to llama.cpp's")
    assert logits.shape == ref_logits.shape
    assert tokens == ref_greedy, (f"{numerics}: first difference at step "
                                  f"{next(i for i, (a, b) in enumerate(zip(tokens, ref_greedy)) if a != b)}")
