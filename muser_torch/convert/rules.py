"""What llama.cpp's converter does per architecture, as data and small functions:
which Hugging Face class becomes which ``general.architecture``, the HF
tensor name of every GGUF tensor (the GGUF names are ``arch/names.py``'s),
the edits (Llama's q/k row permutation, Gemma's +1 on norms, Gemma's
embedding trimmed to the tokenizer), the extra tensors (Llama 3's
``rope_freqs``) and the ``{arch}.*`` keys in the order the converter adds
them (``set_gguf_parameters``).

Keys are added to a gguf-py ``GGUFWriter`` (used only as an ordered
collector: its ``add_*`` methods give every key llama.cpp's value type).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import torch

from ..arch import gemma3 as GEMMA3
from ..arch import muse_glimmer as G
from ..arch.names import TENSOR_NAMES
from ..arch.spec import TensorSpec
from ..errors import ConfigMismatchError, UnsupportedArchitectureError

# HF per-layer module suffix -> names.py short name, per family; "model.layers.{i}." prefixes them.
_LLAMA_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "attn_q", "self_attn.k_proj.weight": "attn_k",
    "self_attn.v_proj.weight": "attn_v", "self_attn.o_proj.weight": "attn_output",
    "self_attn.q_proj.bias": "attn_q_bias", "self_attn.k_proj.bias": "attn_k_bias",
    "self_attn.v_proj.bias": "attn_v_bias",
    "self_attn.q_norm.weight": "attn_q_norm", "self_attn.k_norm.weight": "attn_k_norm",
    "post_attention_layernorm.weight": "ffn_norm",
    "mlp.gate_proj.weight": "ffn_gate", "mlp.up_proj.weight": "ffn_up", "mlp.down_proj.weight": "ffn_down",
}
_GEMMA_LAYER = {**_LLAMA_LAYER,
                "post_attention_layernorm.weight": "post_attention_norm",
                "pre_feedforward_layernorm.weight": "ffn_norm",
                "post_feedforward_layernorm.weight": "post_ffw_norm"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm",
           "lm_head.weight": "output"}

# Name parts of tensors a text conversion leaves out (vision towers, projectors,
# audio): the converter's multimodal filter.
_SKIP_PREFIXES = ("mlp", "vit.", "vpm.", "siglip2.", "conformer.", "merger.", "resampler.",
                  "sound_encoder.", "sound_projection.", "speech_embeddings.")
_SKIP_PARTS = ("visual.", "vision.", "audio.", "talker.", "vision_", "audio_", "token2wav.",
               "code2wav.", "projector.", "pre_mm_projector_norm", "image_newline", "view_seperator",
               "patch_embed", "patch_embedding", "patch_merger.", "patch_merge_mlp.", "model.connector.")


def text_tensor_name(name: str) -> str | None:
    """The name the converter gives a checkpoint tensor of a text model, None
    for one it leaves out (a vision tower, a projector)."""
    if name.startswith(_SKIP_PREFIXES) or any(p in name for p in _SKIP_PARTS):
        return None
    return name.replace("language_model.", "")


@dataclass(frozen=True)
class Family:
    """One converter class: the HF architectures it takes and what it does."""
    gguf_arch: str
    hf_archs: tuple[str, ...]
    layer_names: dict[str, str]
    vocab: str                             # vocab.write_vocab family
    keys: Callable[[Any, dict], None]      # add the {arch}.* keys after the common ones
    permute_qk: bool = False               # Llama: rows to ggml's interleaved-pair RoPE
    norm_shift: float = 0.0                # Gemma: + 1 on norms (shifted_rows, or every *norm.weight)
    shifted_rows: frozenset[str] | None = None
    trim_embedding: bool = False           # Gemma: embedding rows cut to the tokenizer's count
    extra: Callable[[dict], Iterable[tuple[str, torch.Tensor]]] = field(default=lambda hp: ())
    # tensors the converter writes after a checkpoint tensor: (hp, GGUF name) -> [(name, tensor)]
    synthesized: Callable[[dict, str], list[tuple[str, torch.Tensor]]] = field(default=lambda hp, n: [])
    # (hp, n_layers): ConfigMismatchError for a config.json value the file cannot
    # carry (llama.cpp fixes it for the architecture and would compute another model)
    check: Callable[[dict, int], None] = field(default=lambda hp, n: None)

    def shifts(self, gguf_name: str) -> bool:
        """Whether the converter adds ``norm_shift`` to this tensor."""
        if not self.norm_shift:
            return False
        if self.shifted_rows is None:
            return gguf_name.endswith("norm.weight")
        return _pattern_of(gguf_name) in self.shifted_rows

    def spec(self, hf_name: str) -> "tuple[TensorSpec, int | None] | None":
        """names.py's row for a (text) checkpoint tensor and its layer, None if unnamed."""
        if hf_name in _GLOBAL:
            return TENSOR_NAMES[_GLOBAL[hf_name]], None
        parts = hf_name.split(".", 3)
        if len(parts) == 4 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdecimal():
            short = self.layer_names.get(parts[3])
            if short is not None:
                return TENSOR_NAMES[short], int(parts[2])
        return None


# ---- the {arch}.* keys ----------------------------------------------------------------

def rope_parameters(hp: dict) -> dict:
    """The converter's view of RoPE: HF's rope_parameters (or rope_scaling), the
    theta mirrored in, split into full/sliding for Gemma 3."""
    rope = dict(hp.get("rope_parameters", hp.get("rope_scaling")) or {})
    if "full_attention" not in rope and "sliding_attention" not in rope:
        theta = next((hp[k] for k in ("global_rope_theta", "rope_global_theta", "rope_theta_global",
                                      "rope_theta", "rotary_emb_base") if k in hp), None)
        local = next((hp[k] for k in ("local_rope_theta", "rope_local_theta", "rope_theta_local",
                                      "swa_rope_theta", "rope_local_base_freq") if k in hp), None)
        if local is not None:
            rope["sliding_attention"] = {"rope_theta": local}
        if "rope_theta" not in rope and theta is not None:
            rope["rope_theta"] = theta
        if "rope_type" not in rope and rope.get("type") is not None:
            rope["rope_type"] = rope["type"]
        for k in ("partial_rotary_factor", "original_max_position_embeddings"):
            if k not in rope and hp.get(k) is not None:
                rope[k] = hp[k]
    return rope


def _first(hp: dict, *keys: str) -> Any:
    return next((hp[k] for k in keys if k in hp), None)


def common_keys(w: Any, hp: dict, n_layers: int) -> None:
    """TextModel.set_gguf_parameters for the dense decoders here, in its order
    (everything but ``general.file_type``, which the caller adds last)."""
    import gguf
    w.add_block_count(n_layers)
    for add, keys in ((w.add_context_length, ("max_position_embeddings", "n_ctx", "n_positions",
                                              "max_length", "max_sequence_length", "model_max_length")),
                      (w.add_embedding_length, ("hidden_size", "n_embd", "dim")),
                      (w.add_feed_forward_length, ("prefix_dense_intermediate_size",
                                                   "dense_intermediate_size", "intermediate_size",
                                                   "n_inner", "hidden_dim")),
                      (w.add_head_count, ("num_attention_heads", "n_head", "n_heads")),
                      (w.add_head_count_kv, ("num_key_value_heads", "n_kv_heads"))):
        v = _first(hp, *keys)
        if v is not None:
            add(v)
    if hp.get("is_causal") is False:
        w.add_causal_attention(False)
    rope = rope_parameters(hp)
    full = rope.get("full_attention", rope)
    kind, factor = full.get("rope_type"), full.get("factor")
    if kind == "linear" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(factor)
    elif kind == "yarn" and factor is not None:
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(factor)
        w.add_rope_scaling_orig_ctx_len(full["original_max_position_embeddings"])
        for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                         ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if key == "beta_fast":   # the attention factor comes between ext_factor and beta_fast
                attn = full.get("attention_factor", full.get("attn_factor"))
                if attn is not None:
                    w.add_rope_scaling_yarn_attn_factor(attn)
            if full.get(key) is not None:
                add(full[key])
    elif kind in ("su", "longrope"):
        w.add_rope_scaling_type(gguf.RopeScalingType.LONGROPE)
    if full.get("rope_theta") is not None:
        w.add_rope_freq_base(full["rope_theta"])
    local = rope.get("sliding_attention", {}).get("rope_theta")
    if local is not None:
        w.add_rope_freq_base_swa(local)
    eps = _first(hp, "rms_norm_eps", "norm_eps")
    if eps is not None:
        w.add_layer_norm_rms_eps(eps)
    eps = _first(hp, "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")
    if eps is not None:
        w.add_layer_norm_eps(eps)
    if hp.get("head_dim") is not None:
        w.add_key_length(hp["head_dim"])
        w.add_value_length(hp["head_dim"])


def _llama_keys(w: Any, hp: dict) -> None:
    w.add_vocab_size(hp["vocab_size"])
    w.add_rope_dimension_count(hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"])


def _no_keys(w: Any, hp: dict) -> None:
    pass


def _gemma3_keys(w: Any, hp: dict) -> None:
    w.add_context_length(hp.get("max_position_embeddings", 131072))
    w.add_head_count(hp.get("num_attention_heads", 8))
    w.add_layer_norm_rms_eps(hp.get("rms_norm_eps", 1e-6))
    w.add_key_length(hp.get("head_dim", 256))
    w.add_value_length(hp.get("head_dim", 256))
    w.add_rope_freq_base(rope_parameters(hp).get("full_attention", rope_parameters(hp))
                         .get("rope_theta", 1_000_000.0))
    if hp.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    if hp.get("sliding_window_pattern") != 1:
        w.add_sliding_window(hp["sliding_window"])
    w.add_head_count_kv(hp.get("num_key_value_heads", 4))


def _gemma3_check(hp: dict, n_layers: int) -> None:
    """The query scale and the local/global layers are not keys of a gemma3
    file: llama.cpp fixes them (``arch/gemma3.py``). A config.json giving
    others would convert into a file computing a different model."""
    heads = hp.get("num_attention_heads", 8)
    want = GEMMA3.query_pre_attn_scalar(n_layers, hp["hidden_size"], heads, hp.get("head_dim", 256))
    got = hp.get("query_pre_attn_scalar")
    if got is not None and float(got) != want:
        raise ConfigMismatchError(
            f"config.json's query_pre_attn_scalar is {got}, but a gemma3 file has no key for it: "
            f"llama.cpp (and muser-torch) scale queries by 1/sqrt({want:g}) for this model, so "
            f"the converted file would compute another model")
    types = hp.get("layer_types")
    if types is not None:
        want_types = ["full_attention" if g else "sliding_attention"
                      for g in GEMMA3.global_layers(n_layers)]
        if list(types) != want_types:
            i = next((i for i, (a, b) in enumerate(zip(types, want_types)) if a != b), len(types))
            raise ConfigMismatchError(
                f"config.json's layer_types differ from llama.cpp's gemma3 pattern (every "
                f"{GEMMA3.DEFAULT_PATTERN}th layer global) at layer {i}; a gemma3 file has no key "
                f"for another pattern, so the converted file would compute another model")


# ---- extra tensors ----------------------------------------------------------------------

def llama3_rope_factors(hp: dict) -> Iterable[tuple[str, torch.Tensor]]:
    """``rope_freqs.weight`` for Llama 3 RoPE scaling: one divisor per rotated pair."""
    rope = rope_parameters(hp)
    full = rope.get("full_attention", rope)
    if str(full.get("rope_type", "")).lower() != "llama3":
        return
    base = full.get("rope_theta", 10000.0)
    dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = full.get("factor", 8.0)
    low, high = full.get("low_freq_factor", 1.0), full.get("high_freq_factor", 4.0)
    old_ctx = full.get("original_max_position_embeddings", 8192)
    out = []
    for f in freqs:       # float32 arithmetic on each frequency, as the converter's loop
        wavelen = 2 * math.pi / f
        if wavelen < old_ctx / high:
            out.append(1)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    yield TENSOR_NAMES["rope_freqs"].name, torch.tensor(out, dtype=torch.float32)


# ---- Muse Glimmer: the converter's rules are arch/muse_glimmer.py's tables ---------------

def _pattern_of(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``blk.{i}.attn_q.weight``."""
    parts = gguf_name.split(".")
    return ".".join(["blk", "{i}", *parts[2:]]) if parts[0] == "blk" else gguf_name


def _glimmer_layer_names() -> dict[str, str]:
    """HF per-layer suffix -> names.py short name, from muse_glimmer.HF_NAMES."""
    by_pattern = {spec.name: short for short, spec in TENSOR_NAMES.items()}
    out = {}
    for gguf_pat, hf_pat in G.HF_NAMES.items():
        if "{i}" in hf_pat:
            out[hf_pat.split("{i}.", 1)[1]] = by_pattern[gguf_pat]
    return out


def _glimmer_synthesized(hp: dict, gguf_name: str) -> list[tuple[str, torch.Tensor]]:
    """attn_q_norm = qk_scale_factor and attn_k_norm = ones, written after attn_q / attn_k."""
    out = []
    for pat, value in G.SYNTHESIZED.items():
        base = pat.replace("_norm.weight", ".weight")
        if _pattern_of(gguf_name) == base:
            v = float(hp[value]) if isinstance(value, str) else float(value)
            out.append((pat.format(i=gguf_name.split(".")[1]), torch.full((hp["head_dim"],), v)))
    return out


def _glimmer_keys(w: Any, hp: dict) -> None:
    w.add_final_logit_softcapping(hp["final_logit_softcapping"])
    w.add_logit_scale(hp["output_multiplier"])
    w.add_sliding_window(hp["sliding_window"])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in hp["layer_types"]])


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM", "LlamaModel"),
           _LLAMA_LAYER, "llama", _llama_keys, permute_qk=True, extra=llama3_rope_factors),
    Family("qwen2", ("Qwen2ForCausalLM", "Qwen2Model"), _LLAMA_LAYER, "qwen", _no_keys),
    Family("qwen3", ("Qwen3ForCausalLM",), _LLAMA_LAYER, "qwen", _no_keys),
    Family("gemma3", ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"), _GEMMA_LAYER, "gemma3",
           _gemma3_keys, norm_shift=1.0, trim_embedding=True, check=_gemma3_check),
    Family(G.ARCH, ("MuseGlimmerForConditionalGeneration",), _glimmer_layer_names(), "glimmer",
           _glimmer_keys, permute_qk=True, norm_shift=1.0, shifted_rows=G.NORM_SHIFTED,
           synthesized=_glimmer_synthesized),
)


def family_of(hp: dict) -> Family:
    """The converter class for config.json's ``architectures[0]`` (a
    ``text_config``'s own architectures win, as in the converter)."""
    archs = (hp.get("text_config") or {}).get("architectures") or hp.get("architectures") or []
    name = archs[0] if archs else None
    for fam in FAMILIES:
        if name in fam.hf_archs:
            return fam
    known = sorted(a for f in FAMILIES for a in f.hf_archs)
    raise UnsupportedArchitectureError(
        f"config.json names architecture {name!r}; muser-torch convert knows {', '.join(known)}")


def text_hparams(hp: dict) -> dict:
    """A text_config's keys lifted to the top level (the converter's view)."""
    return {**hp, **hp["text_config"]} if isinstance(hp.get("text_config"), dict) else hp


def permute_rows(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Per head, HF's rotate-half rows [x0..x(d/2-1), y0..] become ggml's
    interleaved pairs [x0, y0, x1, y1, ...]: llama.cpp's "normal" RoPE layout."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
