"""Gemma 3 270M Q4_K_M against llama.cpp's own CPU forward on the same file
(``lcpp_logits``, built by ``tools/peers.sh``, or the binary MUSER_LCPP_LOGITS
names; else these tests skip).

Both numerics modes must give llama.cpp's 64-token greedy continuation of a
fixed prompt. The last-position logits are compared too and their relative
error printed: issue 22 asks 1e-3 of ``ggml`` mode, which is not reached
(measured 2026-12-02: exact 2.6%, ggml 5.6-6.6%; docs/cpu.md says where the
rest comes from: llama.cpp's f16 KV cache and flash attention, its f16 GELU
table, and its repacked Q4_K kernels), so that bound is not asserted.
"""
from __future__ import annotations

import pytest
import torch

from ..lcpp import llama_cpp_logits, skip_unless_available

PROMPT = [2, 651, 6037, 3756, 529, 506, 5279, 563, 236743, 8732, 9998, 531, 1586, 532, 7225, 236764]
N_GREEDY = 64


@pytest.fixture(scope="module")
def lcpp(gemma_path):
    skip_unless_available()
    return llama_cpp_logits(gemma_path, PROMPT, N_GREEDY)


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
