"""Small random-weight GGUFs of llama.cpp's ``llama``, ``qwen2`` and ``qwen3``
architectures, written as llama.cpp's converter and quantizer would write
them from the same Hugging Face weights.

How a file is made, each step from someone else's code:

1. transformers' own config class (``LlamaConfig`` ...) and model class, built
   on the meta device, give the Hugging Face parameter names and shapes;
   the values are drawn from a seeded generator.
2. The converter's edits (``convert_hf_to_gguf.py``; ``conversion/llama.py``
   and ``base.py`` in the split version): for ``llama`` only, the q/k rows
   (weights and biases) are permuted so that llama.cpp's "normal" RoPE,
   which rotates adjacent pairs, equals HF's rotate-half; Llama 3 RoPE
   scaling becomes a ``rope_freqs.weight`` tensor of per-pair factors;
   linear and YaRN scaling become ``{arch}.rope.scaling.*`` keys.
3. gguf-py's ``TensorNameMap`` (llama.cpp's table of HF names) names the
   tensors: ``token_embd``, ``blk.N.attn_q`` ... ``output``.
4. ggml's own quantizer (``ggml_quantize_chunk`` via libggml-python) packs
   every matrix into a mix of types; 1-D tensors (norms, biases,
   ``rope_freqs``) stay F32 as the converter keeps them.

The tests hold transformers' load of a file to the file's bytes; only the
all-F32 check compares it with the floats drawn here (to show the file is
the converted model, names, permutation and config included).

transformers' GGUF loader reads neither ``rope.scaling.*`` nor
``rope_freqs`` for these architectures, nor ``attention.key_length`` for
qwen3 (it keeps Qwen3Config's head_dim of 128): :func:`load_transformers`
passes those facts to it as config overrides, taken from the file.
"""
from __future__ import annotations

import functools
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import gguf
import torch
from gguf.constants import GGMLQuantizationType, GGUFValueType, LlamaFileType

from muser_torch import load_gguf, save_gguf
from muser_torch.convert.rules import llama3_rope_factors as converter_llama3_rope_factors
from muser_torch.convert.rules import permute_rows

from ..formats.ggml_ref import quantize_chunk
from ..versions import require_transformers

ARCHS = ("llama", "qwen2", "qwen3")

# Every type llama.cpp's common presets write, cycled over the file's matrices
# (rotated by the seed, so each run puts each type on different tensors).
DEFAULT_MIX = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16")

V = GGUFValueType


def gguf_arch(arch: str) -> gguf.MODEL_ARCH:
    """gguf-py's MODEL_ARCH for an architecture name (``general.architecture``)."""
    for key, name in gguf.MODEL_ARCH_NAMES.items():
        if name == arch:
            return key
    raise ValueError(f"gguf-py knows no architecture {arch!r}")


def hf_config(arch: str, *, n_layers: int, hidden: int, ffn: int, n_heads: int, n_kv_heads: int,
              head_dim: int | None, vocab: int, context: int, rope_theta: float, rms_eps: float,
              rope: Mapping[str, Any] | None, tied: bool):
    """The transformers config the converter would read (config.json)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config}[arch]
    rope_parameters = {"rope_type": "default", **(rope or {}), "rope_theta": rope_theta}
    kwargs: dict[str, Any] = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads,
        max_position_embeddings=context, rms_norm_eps=rms_eps, tie_word_embeddings=tied,
        rope_parameters=rope_parameters)
    if head_dim is not None:
        kwargs["head_dim"] = head_dim
    return cls(**kwargs)


def random_hf_weights(config, seed: int) -> dict[str, torch.Tensor]:
    """HF-named float32 weights, shaped by transformers' own model class.

    Scales keep a random network lively: projections ~ N(0, 1/n_in), norms
    1 + N(0, 0.2^2) (never all ones, so a dropped norm shows), biases and
    embeddings O(0.1..1), the output head wide enough that greedy picks are
    rarely near ties."""
    from transformers import AutoModelForCausalLM
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name, meta in model.state_dict().items():
        if name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        out[name] = random_tensor(name, tuple(meta.shape), gen)
    return out


def random_tensor(name: str, shape: tuple, gen: torch.Generator, *, head_gain: float = 4.0,
                  centered_norms: bool = False) -> torch.Tensor:
    """A fresh random tensor for checkpoint tensor ``name``, scaled so a random
    model's activations stay O(1): norms near 1 (near 0 for ``centered_norms``'
    ``*layernorm.weight``, which the model uses as 1 + w), small biases, unit
    embeddings, projections over sqrt(fan-in), the lm_head ``head_gain`` times that."""
    z = torch.randn(shape, generator=gen)
    if centered_norms and name.endswith("layernorm.weight"):
        w = 0.2 * z
    elif name.endswith("norm.weight"):
        w = 1.0 + 0.2 * z
    elif name.endswith(".bias"):
        w = 0.1 * z
    elif name.endswith("embed_tokens.weight"):
        w = z
    elif name == "lm_head.weight":
        w = head_gain * z / math.sqrt(shape[1])
    else:
        w = z / math.sqrt(shape[1])
    return w.contiguous()


# llama.cpp's converter permutation of q or k rows, per head [x0..x(d/2-1),
# y0..] -> [x0, y0, x1, y1, ...]: the package's converter owns it
# (muser_torch.convert.rules); test_permutation_pairs_rotate_half_halves
# checks it position by position.
permute_qk = permute_rows


def unpermute_qk(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """The inverse of :func:`permute_qk` (what transformers does at load)."""
    d2 = w.shape[0] // n_head // 2
    return w.reshape(n_head, d2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def llama3_rope_factors(head_dim: int, rope: Mapping[str, Any], rope_theta: float) -> torch.Tensor:
    """The converter's ``rope_freqs.weight`` for Llama 3 scaling: one factor per
    rotated pair, dividing that pair's frequency (the package's converter
    rule, ``muser_torch.convert.rules.llama3_rope_factors``).

    These files are written for an original context of 8192 (Llama 3.x's);
    a ``rope`` naming another value is refused rather than written wrong."""
    if rope.get("original_max_position_embeddings", 8192) != 8192:
        raise ValueError("llama.cpp's converter computes llama3 factors for an original context of 8192")
    hp = {"head_dim": head_dim, "rope_parameters": {**rope, "rope_type": "llama3", "rope_theta": rope_theta}}
    (_, factors), = converter_llama3_rope_factors(hp)
    return factors


def head_dim_of(config) -> int:
    """Qwen2Config has no head_dim: hidden / heads, as its attention computes it."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def convert(arch: str, config, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The converter's tensor edits and names: GGUF name -> float32 tensor."""
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    names = gguf.get_tensor_name_map(gguf_arch(arch), config.num_hidden_layers)
    out: dict[str, torch.Tensor] = {}
    rope = config.rope_parameters or {}
    if arch == "llama" and rope.get("rope_type") == "llama3":
        out["rope_freqs.weight"] = llama3_rope_factors(head_dim_of(config), rope, rope["rope_theta"])
    for hf_name, w in hf.items():
        if arch == "llama":
            if ".q_proj." in hf_name:
                w = permute_qk(w, n_head)
            elif ".k_proj." in hf_name:
                w = permute_qk(w, n_kv)
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if gguf_name is None:
            raise ValueError(f"gguf-py maps no {arch} tensor to {hf_name!r}")
        out[gguf_name] = w
    return out


def rope_metadata(arch: str, rope: Mapping[str, Any] | None) -> dict[str, Any]:
    """``{arch}.rope.scaling.*`` as the converter writes them (llama3 scaling
    is a tensor, not keys)."""
    if not rope:
        return {}
    kind = rope.get("rope_type")
    if kind == "linear":
        return {f"{arch}.rope.scaling.type": "linear", f"{arch}.rope.scaling.factor": float(rope["factor"])}
    if kind == "yarn":
        out = {f"{arch}.rope.scaling.type": "yarn", f"{arch}.rope.scaling.factor": float(rope["factor"]),
               f"{arch}.rope.scaling.original_context_length": int(rope["original_max_position_embeddings"])}
        for hf_key, key in (("extrapolation_factor", "yarn_ext_factor"), ("attention_factor", "yarn_attn_factor"),
                            ("beta_fast", "yarn_beta_fast"), ("beta_slow", "yarn_beta_slow")):
            if hf_key in rope:
                out[f"{arch}.rope.scaling.{key}"] = float(rope[hf_key])
        return out
    if kind in ("llama3", "default", None):
        return {}
    raise ValueError(f"no converter rule for rope_type {kind!r}")


def model_metadata(arch: str, config, rope: Mapping[str, Any] | None) -> dict[str, Any]:
    """The architecture keys the converter writes for ``arch``."""
    head_dim = head_dim_of(config)
    md: dict[str, Any] = {
        "general.architecture": arch,
        "general.name": f"random {arch}",
        f"{arch}.block_count": config.num_hidden_layers,
        f"{arch}.context_length": config.max_position_embeddings,
        f"{arch}.embedding_length": config.hidden_size,
        f"{arch}.feed_forward_length": config.intermediate_size,
        f"{arch}.attention.head_count": config.num_attention_heads,
        f"{arch}.attention.head_count_kv": config.num_key_value_heads,
        f"{arch}.rope.freq_base": float(config.rope_parameters["rope_theta"]),
        f"{arch}.attention.layer_norm_rms_epsilon": float(config.rms_norm_eps),
    }
    # base.py writes key/value_length whenever config.json names a head_dim:
    # Qwen3's always does; a Llama's does where head_dim * heads != hidden.
    if arch == "qwen3" or head_dim * config.num_attention_heads != config.hidden_size:
        md[f"{arch}.attention.key_length"] = head_dim
        md[f"{arch}.attention.value_length"] = head_dim
    if arch == "llama":   # LlamaModel.set_gguf_parameters
        md[f"{arch}.vocab_size"] = config.vocab_size
        md[f"{arch}.rope.dimension_count"] = head_dim
    md.update(rope_metadata(arch, rope))
    return md


# ---- tokenizer metadata --------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _trained_tokenizer(kind: str, vocab: int) -> tuple[tuple[str, Any], ...]:
    from ..text.tiny_tokenizers import gpt2_metadata, llama_metadata
    md = llama_metadata(seed=0, vocab_size=vocab) if kind == "llama" else gpt2_metadata(seed=0, vocab_size=vocab, pre=kind)
    return tuple(md.items())


def default_tokenizer(arch: str, vocab: int) -> dict[str, Any]:
    """The tokenizer llama.cpp files of the family carry, from the tests'
    trained tiny tokenizers (``tests/text/tiny_tokenizers.py``): Llama 2's
    sentencepiece ``llama`` model for ``llama`` (``vocab`` tokens), a
    byte-level BPE ``gpt2`` model with Qwen's pre-tokenizer for the Qwens
    (``vocab`` learned tokens and its special tokens after them)."""
    kind = "llama" if arch == "llama" else "qwen2"
    return {k: list(v) if isinstance(v, list) else v for k, v in _trained_tokenizer(kind, vocab)}


TOKENIZER_TYPES = {"tokenizer.ggml.token_type": V.INT32, "tokenizer.ggml.scores": V.FLOAT32}


# ---- the file ------------------------------------------------------------------

def _quantized(w: torch.Tensor, type_name: str) -> tuple[int, torch.Tensor, tuple[int, ...]]:
    """(type id, packed rows, ne) of a float matrix, packed by ggml."""
    qtype = GGMLQuantizationType[type_name]
    packed = quantize_chunk(w.reshape(w.shape[0], -1), int(qtype))
    return int(qtype), packed, tuple(reversed(w.shape))


def _file_type(types: Sequence[str]) -> int:
    """``general.file_type``: the llama.cpp preset named after the most common
    matrix type (a K-quant's medium preset, which mixes types as these files do)."""
    common = max(sorted(set(types)), key=list(types).count)
    name = {"F32": "ALL_F32", "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M",
            "Q3_K": "MOSTLY_Q3_K_M", "MXFP4": "MOSTLY_MXFP4_MOE"}.get(common, f"MOSTLY_{common}")
    return int(LlamaFileType[name])


def write_random_gguf(path: "str | os.PathLike[str]", arch: str, *, seed: int,
                      types: Sequence[str] = DEFAULT_MIX, type_of: Mapping[str, str] | None = None,
                      tied: bool = False, n_layers: int = 2, hidden: int = 256, ffn: int = 512,
                      n_heads: int = 4, n_kv_heads: int = 2, head_dim: int | None = None,
                      vocab: int = 384, context: int = 512, rope_theta: float = 10000.0,
                      rms_eps: float = 1e-6, rope: Mapping[str, Any] | None = None,
                      tokenizer: Mapping[str, Any] | None = None,
                      edit: Callable[[dict, dict], None] | None = None) -> Path:
    """Write a random ``arch`` model to ``path`` and return the path.

    ``types``: matrix types cycled over the file's matrices in order, rotated
    by ``seed``; ``type_of`` pins a type per GGUF tensor name (any type ggml
    can quantize, Q2_K included). ``head_dim`` defaults to hidden / n_heads
    (qwen3: 128, as Qwen3 models have and transformers' loader assumes).
    ``rope``: HF ``rope_parameters`` beyond the theta (``{"rope_type":
    "linear", "factor": 2.0}``, ``"yarn"``, ``"llama3"``). ``tokenizer``: a
    ``tokenizer.ggml.*`` block (its token count sets the vocabulary); by
    default :func:`default_tokenizer` of about ``vocab`` tokens. ``edit(metadata, tensors)`` may change
    the two dicts (GGUF name -> save_gguf spec) just before writing, for bad
    files."""
    require_transformers("a random file of the llama family (its GPT-2-style vocabulary)")
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    tokenizer = default_tokenizer(arch, vocab) if tokenizer is None else tokenizer
    vocab = len(tokenizer["tokenizer.ggml.tokens"])
    if head_dim is None and arch == "qwen3":
        head_dim = 128
    config = hf_config(arch, n_layers=n_layers, hidden=hidden, ffn=ffn, n_heads=n_heads,
                       n_kv_heads=n_kv_heads, head_dim=head_dim, vocab=vocab, context=context,
                       rope_theta=rope_theta, rms_eps=rms_eps, rope=rope, tied=tied)
    floats = convert(arch, config, random_hf_weights(config, seed))

    matrices = [n for n, w in floats.items() if w.dim() == 2]
    offset = seed % len(types)
    chosen = {n: types[(i + offset) % len(types)] for i, n in enumerate(matrices)}
    chosen.update(type_of or {})
    tensors: dict[str, Any] = {}
    for name, w in floats.items():
        tensors[name] = _quantized(w, chosen[name]) if name in chosen else ("F32", w.float())

    metadata = model_metadata(arch, config, rope)
    metadata["general.file_type"] = _file_type([chosen[n] for n in matrices])
    metadata["general.quantization_version"] = 2
    metadata.update(tokenizer)
    if edit is not None:
        edit(metadata, tensors)
    save_gguf(path, metadata, tensors, types=TOKENIZER_TYPES)
    return Path(path)


def load_transformers(path: "str | os.PathLike[str]", *, rope: Mapping[str, Any] | None = None):
    """transformers' own class for the file (LlamaForCausalLM, ...), loaded
    from it in float32, told what its GGUF loader does not read: ``rope``
    (the HF ``rope_parameters`` the file was made with; transformers reads
    neither ``rope.scaling.*`` nor ``rope_freqs``) and qwen3's head_dim from
    ``attention.key_length``."""
    from transformers import AutoModelForCausalLM
    path = Path(path)
    md = load_gguf(path).metadata
    arch = md["general.architecture"]
    overrides: dict[str, Any] = {}
    if rope:
        overrides["rope_parameters"] = {**rope, "rope_theta": md[f"{arch}.rope.freq_base"]}
    if arch == "qwen3" and f"{arch}.attention.key_length" in md:
        overrides["head_dim"] = md[f"{arch}.attention.key_length"]
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32, **overrides)
    return model.eval()
