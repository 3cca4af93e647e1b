"""Random llama / qwen2 / qwen3 GGUFs (``hf_files``) as session fixtures,
drawn fresh each session from ``conftest.SEED``, and transformers' own
classes loaded from them. Test modules import the fixtures they use."""
from __future__ import annotations

import pytest
import torch

from ..versions import require_transformers
from .conftest import SEED

# name -> (arch, write_random_gguf options). RoPE scalings as the converter
# writes them; transformers is told the same scaling (it reads none of it).
VARIANTS = {
    "llama": ("llama", {}),
    "llama-tied": ("llama", {"tied": True}),
    "llama-linear": ("llama", {"rope": {"rope_type": "linear", "factor": 2.0}}),
    "llama-yarn": ("llama", {"rope": {"rope_type": "yarn", "factor": 4.0,
                                      "original_max_position_embeddings": 64}}),
    "llama-llama3": ("llama", {"rope": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                        "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 8192},
                               "rope_theta": 500000.0}),
    "qwen2": ("qwen2", {"rope_theta": 1e6}),
    "qwen2-tied-yarn": ("qwen2", {"tied": True, "rope": {"rope_type": "yarn", "factor": 4.0,
                                                          "original_max_position_embeddings": 32,
                                                          "beta_fast": 16.0, "beta_slow": 2.0}}),
    "qwen3": ("qwen3", {"rope_theta": 1e6}),
    "qwen3-tied": ("qwen3", {"tied": True, "n_layers": 3}),
    "qwen3-iq4-mxfp4": ("qwen3", {"rope_theta": 1e6, "types": ("IQ4_XS", "IQ4_NL", "MXFP4")}),
    "llama-iq3": ("llama", {"types": ("IQ3_XXS", "IQ3_S")}),
}
ARCH_VARIANTS = ("llama", "qwen2", "qwen3")


@pytest.fixture(scope="session")
def hf_file(tmp_path_factory):
    """variant -> path, written on first use."""
    require_transformers("the llama-family files (their GPT-2-style vocabularies)")
    pytest.importorskip("accelerate", reason="transformers' GGUF loader needs accelerate")
    from ..formats.ggml_ref import lib as ggml_lib
    ggml_lib()
    from .hf_files import write_random_gguf
    root = tmp_path_factory.mktemp("hf")
    made: dict[str, str] = {}

    def get(variant: str) -> str:
        if variant not in made:
            arch, opts = VARIANTS[variant]
            seed = SEED + sorted(VARIANTS).index(variant)
            made[variant] = str(write_random_gguf(root / f"{variant}.gguf", arch, seed=seed, **opts))
        return made[variant]
    return get


@pytest.fixture(scope="session")
def reference(hf_file):
    """variant -> transformers' model of that file (float32)."""
    from .hf_files import load_transformers
    loaded = {}

    def get(variant: str):
        if variant not in loaded:
            loaded[variant] = load_transformers(hf_file(variant), rope=VARIANTS[variant][1].get("rope"))
        return loaded[variant]
    return get


def tokens(vocab: int, n: int, batch: int = 1, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED * 7919 + salt)
    return torch.randint(0, vocab, (batch, n), generator=g)
