"""A DFlash draft's facts (``general.architecture = "dflash"``): Muse
Glimmer's released drafter (transformers' ``MuseGlimmerAssistantModel``), as
llama.cpp's converter writes it and ``src/models/dflash.cpp`` reads it. The
model is ``models/dflash.py``; the round that runs it, ``models/speculative.py``.

What the file carries:

* the decoder keys (``embedding_length`` ... ``attention.layer_norm_rms_epsilon``,
  ``rope.freq_base``) of the draft's own layers, which are plain pre-norm
  blocks: learned q/k norms, NeoX (rotate-half) RoPE on q/k in the
  checkpoint's order, plain ``w`` norms, a SwiGLU MLP;
* ``target_layers``: the target layers whose *input* the draft reads, i.e.
  transformers' ``target_layer_ids`` + 1 (layer ``L - 1``'s output);
* ``block_size`` (default 16) and ``tokenizer.ggml.mask_token_id``;
* ``attention.sliding_window`` and its per-layer bool pattern: a sliding
  layer attends, bidirectionally, to keys within ``window`` positions either
  way (``|q - k| <= window``, transformers' bidirectional sliding mask);
* no ``token_embd`` and no ``output``: the draft embeds its block with the
  target's raw embedding (no embedding norm or scale) and scores it with the
  target's lm_head (no logit scale, no soft-cap);
* the vocabulary: the target's tokenizer (the converter copies it), or
  ``vocab_size`` for a file without tokens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..formats import GGMLType
from .llama import _one
from .names import tensor_table
from .spec import (DECODER_KEYS, LLAMA_CPP_TYPES, MAX_CONTEXT, MAX_SIZE, Architecture, DecoderConfig,
                   Key, Role,
                   key_names, number, read_keys)

__all__ = ["ARCH", "DFlashConfig", "DFLASH", "TENSORS", "MASK_KEY", "DEFAULT_BLOCK", "HF_NAMES"]

ARCH = "dflash"
MASK_KEY = "tokenizer.ggml.mask_token_id"
DEFAULT_BLOCK = 16          # llama.cpp's default when dflash.block_size is absent
PATTERN_KEY = "attention.sliding_window_pattern"

# the decoder keys read as every decoder reads them (head_count_kv, key_length
# and the window are read on their own: defaults that depend on other keys)
KEYS = tuple(k for k in DECODER_KEYS if k.field not in ("n_kv_heads", "head_dim", "sliding_window")) + (
    Key("rope_base", "rope.freq_base", real=True, lo=1.0, hi=1e12, default=10000.0),
    Key("block_size", "block_size", lo=2, hi=4096, default=DEFAULT_BLOCK),
)


@dataclass(frozen=True)
class DFlashConfig(DecoderConfig):
    """A DFlash draft. ``target_layers`` are llama.cpp's (the tapped layer's
    index + 1); ``sliding_window`` 0 means no window, ``swa_layers`` which
    layers use it."""
    ARCH_NAME = ARCH

    rope_base: float
    block_size: int
    mask_token_id: int
    target_layers: tuple[int, ...]
    vocab_size: int
    swa_layers: tuple[bool, ...] = ()

    @property
    def n_taps(self) -> int:
        return len(self.target_layers)

    @property
    def fc_in(self) -> int:
        return self.n_taps * self.hidden

    def window(self, layer: int) -> int | None:
        """Layer ``layer``'s window (None: it sees every key)."""
        return self.sliding_window if self.sliding_window and self.swa_layers[layer] else None

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "DFlashConfig":
        """KeyError (a missing key) or ValueError naming the key."""
        a = ARCH
        v = read_keys(md, a, KEYS)
        v["n_kv_heads"] = _one(md, f"{a}.attention.head_count_kv", v["n_heads"])
        key = f"{a}.attention.key_length"
        if key not in md and v["hidden"] % v["n_heads"]:
            raise ValueError(f"{a}.embedding_length {v['hidden']} is not a multiple of head_count "
                             f"{v['n_heads']} and the file lacks {key}")
        v["head_dim"] = _one(md, key, v["hidden"] // v["n_heads"])
        for name in ("attention.value_length", "rope.dimension_count"):
            got = _one(md, f"{a}.{name}", v["head_dim"])
            if got != v["head_dim"]:
                raise ValueError(f"{a}.{name} is {got}, expected the head size {v['head_dim']}")
        v["target_layers"] = _int_list(md, f"{a}.target_layers")
        v["sliding_window"], v["swa_layers"] = _window(md, v["n_layers"])
        v["vocab_size"] = _vocab_size(md)
        if MASK_KEY not in md:
            raise KeyError(MASK_KEY)
        mask = number(MASK_KEY, md[MASK_KEY], real=False)
        if not 0 <= mask < v["vocab_size"]:
            raise ValueError(f"{MASK_KEY} is {mask}, outside the vocabulary of {v['vocab_size']:,} tokens")
        v["mask_token_id"] = mask
        cfg = cls(**v)
        cfg.check()
        return cfg

    def to_metadata(self) -> dict[str, Any]:
        """The keys a file of this config carries (``vocab_size`` for a file
        without tokens; a real one carries its target's tokenizer)."""
        a = ARCH
        md: dict[str, Any] = {"general.architecture": a}
        for k in KEYS:
            md[f"{a}.{k.name}"] = getattr(self, k.field)
        md |= {f"{a}.attention.head_count_kv": self.n_kv_heads,
               f"{a}.attention.key_length": self.head_dim,
               f"{a}.attention.value_length": self.head_dim,
               f"{a}.target_layers": list(self.target_layers),
               f"{a}.vocab_size": self.vocab_size, MASK_KEY: self.mask_token_id}
        if self.sliding_window:
            md[f"{a}.attention.sliding_window"] = self.sliding_window
            md[f"{a}.{PATTERN_KEY}"] = list(self.swa_layers)
        return md


def _int_list(md: dict[str, Any], key: str) -> tuple[int, ...]:
    if key not in md:
        raise KeyError(key)
    v = md[key]
    if not isinstance(v, (list, tuple)) or not v:
        raise ValueError(f"{key} is {v!r}, expected a non-empty array of layer indices")
    out = tuple(number(f"{key}[{i}]", x, real=False) for i, x in enumerate(v))
    if min(out) < 1 or max(out) > MAX_SIZE:
        raise ValueError(f"{key} is {list(out)}, expected target layer indices >= 1 (the input of "
                         f"layer L is layer L - 1's output)")
    return out


def _window(md: dict[str, Any], n_layers: int) -> tuple[int, tuple[bool, ...]]:
    """llama.cpp's reading: a positive ``attention.sliding_window`` with its
    bool-per-layer pattern (required then); absent or 0: no window."""
    key = f"{ARCH}.attention.sliding_window"
    window = number(key, md[key], real=False) if key in md else 0
    if not 0 <= window <= MAX_CONTEXT:
        raise ValueError(f"{key} is {md[key]!r}, expected an integer from 0 to {MAX_CONTEXT}")
    if window == 0:
        return 0, (False,) * n_layers
    pkey = f"{ARCH}.{PATTERN_KEY}"
    if pkey not in md:
        raise KeyError(pkey)
    p = md[pkey]
    if not isinstance(p, (list, tuple)) or len(p) != n_layers or not all(isinstance(x, bool) for x in p):
        raise ValueError(f"{pkey} is {p!r}, expected a bool per layer ({ARCH}.block_count = {n_layers})")
    return window, tuple(p)


def _vocab_size(md: dict[str, Any]) -> int:
    key = f"{ARCH}.vocab_size"
    declared = _one(md, key, 0) if key in md else None
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, (list, tuple)) and tokens:
        if declared is not None and declared != len(tokens):
            raise ValueError(f"{key} is {declared}, but tokenizer.ggml.tokens has {len(tokens)} tokens")
        return len(tokens)
    if declared is None:
        raise KeyError(key)
    return declared


# llama.cpp's create_tensor list for LLM_ARCH_DFLASH (the plain DFlash path):
# no token_embd and no output (the target's are shared).
TENSORS = tensor_table(
    "fc", "enc_output_norm", "output_norm",
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down",
)
FENCES = {Role.PROJECTION: LLAMA_CPP_TYPES, Role.NORM: frozenset({GGMLType.F32})}

UNDERSTOOD = key_names(KEYS, extra=(
    "attention.head_count_kv", "attention.key_length", "attention.value_length",
    "rope.dimension_count", "target_layers", "attention.sliding_window", PATTERN_KEY, "vocab_size"))

DFLASH = Architecture(ARCH, "DFlash draft", DFlashConfig, TENSORS, FENCES, understood=UNDERSTOOD)


# The converter's side: each GGUF row's tensor in transformers'
# MuseGlimmerAssistantModel checkpoint ({i}: the layer). Nothing is edited:
# q/k stay in the checkpoint's rotate-half order (the graph rotates NeoX
# pairs), the norms are plain w, the q/k norms are learned.
HF_NAMES = {
    "fc.weight": "encoder.fc.weight",
    "enc.output_norm.weight": "encoder.output_norm_enc.weight",
    "output_norm.weight": "norm.weight",
    "blk.{i}.attn_norm.weight": "layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_output.weight": "layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.attn_q_norm.weight": "layers.{i}.self_attn.q_norm.weight",
    "blk.{i}.attn_k_norm.weight": "layers.{i}.self_attn.k_norm.weight",
    "blk.{i}.ffn_norm.weight": "layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "layers.{i}.mlp.down_proj.weight",
}
