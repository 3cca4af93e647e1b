"""ggml's own ``mul_mat`` as the oracle (``muser_torch.bench.ggml_mulmat`` over
libggml-python's prebuilt CPU library, its x86 build: AVX2, ggml-cpu's
``quantize_row_q8_*`` and ``ggml_vec_dot_*``); skips when it is absent."""
from __future__ import annotations

import ctypes

import torch

from muser_torch.bench import ggml_mulmat

from ..formats.ggml_ref import loaded_or_skip


def lib() -> ctypes.CDLL:
    """libggml-cpu with the graph API declared; skips the calling test when absent."""
    return loaded_or_skip(ggml_mulmat.load())


def ggml_mul_mat(packed: torch.Tensor, qtype: int, n_out: int, n_in: int, x: torch.Tensor,
                 threads: int = 1) -> torch.Tensor:
    """ggml's ``x @ W.T`` (float32 ``[T, n_out]``) for W's bytes ``packed``."""
    return ggml_mulmat.mul_mat(lib(), packed, qtype, n_out, n_in, x, threads)
