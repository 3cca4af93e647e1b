"""Muse Glimmer's facts (``general.architecture = "muse-glimmer"``), as
llama.cpp loads and runs it (``src/models/muse-glimmer.cpp``; the
``MuseGlimmerModel`` of its converter, ``conversion/muse_glimmer.py``) and as
transformers defines it (``models/muse_glimmer/``): its keys, tensor table,
dtype fences and the Muser-native lanes. The converter and ``make-tiny`` read
this table; the model is ``models/glimmer.py``.

What the files carry and what llama.cpp fixes when they do not:

* ``attention.sliding_window_pattern``: a bool per layer (true = sliding),
  which the converter always writes from transformers' ``layer_types`` (the
  reference counts global layers back from the last one); or an integer
  period n, which llama.cpp counts from the first layer (layer i slides when
  ``i % n < n - 1``, n = 0: every layer slides); absent: period 4;
* ``rope.freq_base`` (else 10000); ``rope.freq_base_swa`` (else
  ``rope.freq_base``) is the base of the sliding layers, the only ones that
  rotate (NoPE on global layers), never scaled, in ggml's "normal" pair
  layout (the converter un-permutes q/k);
* ``logit_scale`` is required; ``final_logit_softcapping`` defaults to
  llama.cpp's 30 (the converter writes 20);
* head size ``attention.key_length``, else ``embedding_length / head_count``;
  ``value_length`` and ``rope.dimension_count`` must equal it;
* the vocabulary is the tokenizer's token count, or ``vocab_size`` for a file
  without one (``tokenizer.ggml.model = "none"``).

The four layer norms already hold the reference's ``1 + w`` (the converter
adds it); ``output_norm`` is plain ``w``; the post-norms use eps 1e-8; the
embedding passes a weightless RMSNorm; ``attn_q_norm`` holds
``qk_scale_factor`` and ``attn_k_norm`` ones.

Muser-native lanes: ``muser.weight_precision`` = ``q4_k_xl`` | ``nvfp4``
declares one of the Muser engine's artifacts (docs/muse-glimmer.md); its projections are then fenced to
the accelerated types (NVFP4_E2M1 with companions only in the nvfp4 lane).
A file without the key is a llama.cpp file: every type llama.cpp's
quantizer writes, and no NVFP4_E2M1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import DtypeFenceError, LaneError
from ..formats import GGMLType
from .llama import _one
from .names import tensor_table
from .spec import (DECODER_KEYS, LLAMA_CPP_TYPES, MAX_SIZE, Architecture, DecoderConfig, Key,
                   Role, key_names, number, read_keys)

__all__ = ["ARCH", "LANES", "LANE_KEY", "KEYS", "GlimmerConfig", "TENSORS", "FENCES",
           "LANE_FENCES", "MUSE_GLIMMER", "POST_NORM_EPS", "DEFAULT_PERIOD",
           "reference_pattern", "llama_cpp_pattern", "HF_NAMES", "SYNTHESIZED", "NORM_SHIFTED",
           "UNPERMUTED", "HF_KEYS"]

ARCH = "muse-glimmer"
LANES = ("q4_k_xl", "nvfp4")
LANE_KEY = "muser.weight_precision"   # metadata key naming a Muser-native lane, one of LANES
POST_NORM_EPS = 1e-8                  # post_attention_norm / post_ffw_norm (llama.cpp's constant)
DEFAULT_PERIOD = 4                    # llama.cpp's load_swa_pattern(ml, 4)
LLAMA_CPP_SOFTCAP = 30.0              # llama_hparams::f_final_logit_softcapping's default
PATTERN_KEY = "attention.sliding_window_pattern"

# config field <- GGUF key under "muse-glimmer.", read by read_keys (ranged).
# head_count_kv, key_length and the pattern are read on their own (defaults
# that depend on other keys; an array).
_OWN_KEYS = (
    Key("rope_base", "rope.freq_base", real=True, lo=1.0, hi=1e12, default=10000.0),
    Key("logit_scale", "logit_scale", real=True, lo=1e-12, hi=1e6),
    Key("final_softcap", "final_logit_softcapping", real=True, lo=1e-6, hi=1e6,
        default=LLAMA_CPP_SOFTCAP),
)
KEYS = tuple(k for k in DECODER_KEYS if k.field not in ("n_kv_heads", "head_dim")) + _OWN_KEYS
_ROPE_SCALING_TYPES = ("none", "linear")   # scale only the NoPE layers: no effect


def reference_pattern(n_layers: int, period: int = DEFAULT_PERIOD) -> tuple[bool, ...]:
    """transformers' ``layer_types`` as bools (true = sliding): global every
    ``period``-th layer counted back from the last, as the converter writes."""
    return tuple((n_layers - 1 - i) % period != 0 for i in range(n_layers))


def llama_cpp_pattern(n_layers: int, period: int) -> tuple[bool, ...]:
    """llama.cpp's ``set_swa_pattern(period)`` for an integer key: counted from layer 0."""
    return tuple(period == 0 or i % period < period - 1 for i in range(n_layers))


@dataclass(frozen=True)
class GlimmerConfig(DecoderConfig):
    """A Muse Glimmer. ``sliding_window_pattern`` is what the file says: a
    bool per layer (true = sliding) or an integer period (llama.cpp's
    reading, ``llama_cpp_pattern``); ``swa_layers`` is the per-layer answer.
    ``weight_precision`` is the Muser lane, None for a llama.cpp file."""
    ARCH_NAME = ARCH

    vocab_size: int
    sliding_window_pattern: "tuple[bool, ...] | int" = DEFAULT_PERIOD
    rope_base: float = 10000.0
    rope_base_swa: float | None = None     # None: rope_base
    logit_scale: float = 1.0
    final_softcap: float = LLAMA_CPP_SOFTCAP
    weight_precision: str | None = "q4_k_xl"   # None: a llama.cpp file (no lane key)

    @property
    def swa_layers(self) -> tuple[bool, ...]:
        p = self.sliding_window_pattern
        return tuple(p) if isinstance(p, tuple) else llama_cpp_pattern(self.n_layers, p)

    @property
    def swa_base(self) -> float:
        return self.rope_base if self.rope_base_swa is None else self.rope_base_swa

    def is_global(self, layer: int) -> bool:
        return not self.swa_layers[layer]

    def check(self) -> None:
        super().check()
        p = self.sliding_window_pattern
        if isinstance(p, tuple) and len(p) != self.n_layers:
            raise ValueError(f"{ARCH}.{PATTERN_KEY} has {len(p)} entries, expected one per "
                             f"layer ({ARCH}.block_count = {self.n_layers})")

    @classmethod
    def from_metadata(cls, md: dict[str, Any]) -> "GlimmerConfig":
        """Build from GGUF metadata; KeyError (a missing key) or ValueError
        naming the key, what it is and what was expected."""
        a = ARCH
        values = read_keys(md, a, KEYS)
        values["head_dim"] = _head_dim(md, values["hidden"], values["n_heads"])
        values["n_kv_heads"] = _one(md, f"{a}.attention.head_count_kv", values["n_heads"])
        for name in ("rope.dimension_count", "rope.dimension_count_swa", "attention.key_length_swa",
                     "attention.value_length_swa"):
            v = _one(md, f"{a}.{name}", values["head_dim"])
            if v != values["head_dim"]:
                raise ValueError(f"{a}.{name} is {v}, expected the head size {values['head_dim']} "
                                 f"(llama.cpp's muse-glimmer graph rotates and attends whole heads)")
        swa_key = f"{a}.rope.freq_base_swa"
        if swa_key in md:
            values["rope_base_swa"] = read_keys(md, a, (Key("b", "rope.freq_base_swa", real=True,
                                                             lo=1.0, hi=1e12),))["b"]
        _check_rope_scaling(md)
        values["sliding_window_pattern"] = _pattern(md, values["n_layers"])
        values["vocab_size"] = _vocab_size(md)
        lane = md.get(LANE_KEY)
        cfg = cls(**values, weight_precision=lane)
        cfg.check()
        return cfg

    def to_metadata(self) -> dict[str, Any]:
        """The keys a file of this config carries (the pattern as given: an
        array or an integer), the lane key when there is a lane."""
        md: dict[str, Any] = {"general.architecture": ARCH}
        if self.weight_precision is not None:
            md[LANE_KEY] = self.weight_precision
        for k in DECODER_KEYS + _OWN_KEYS:
            md[f"{ARCH}.{k.name}"] = getattr(self, k.field)
        md[f"{ARCH}.attention.value_length"] = self.head_dim   # llama.cpp's default is hidden / heads
        p = self.sliding_window_pattern
        md[f"{ARCH}.{PATTERN_KEY}"] = list(p) if isinstance(p, tuple) else p
        if self.rope_base_swa is not None:
            md[f"{ARCH}.rope.freq_base_swa"] = self.rope_base_swa
        md[f"{ARCH}.vocab_size"] = self.vocab_size
        return md


def _head_dim(md: dict[str, Any], hidden: int, n_heads: int) -> int:
    """``attention.key_length`` and ``value_length``, each defaulting to hidden
    / heads as llama.cpp's do (so a file giving only key_length = 128 for a
    6656-wide, 32-head model is refused, as llama.cpp refuses it)."""
    key, vkey = f"{ARCH}.attention.key_length", f"{ARCH}.attention.value_length"
    if (key not in md or vkey not in md) and hidden % n_heads:
        raise ValueError(f"{ARCH}.embedding_length {hidden} is not a multiple of head_count "
                         f"{n_heads} and the file lacks {key if key not in md else vkey}")
    head_dim = _one(md, key, hidden // n_heads)
    value_length = _one(md, vkey, hidden // n_heads)
    if value_length != head_dim:
        raise ValueError(f"{vkey} is {value_length}{'' if vkey in md else ' (hidden / heads)'}, "
                         f"expected the key length {head_dim} (one head size for k and v)")
    return head_dim


def _pattern(md: dict[str, Any], n_layers: int) -> "tuple[bool, ...] | int":
    key = f"{ARCH}.{PATTERN_KEY}"
    v = md.get(key, DEFAULT_PERIOD)
    if isinstance(v, (list, tuple)):
        if len(v) != n_layers:
            raise ValueError(f"{key} has {len(v)} entries, expected one per layer "
                             f"({ARCH}.block_count = {n_layers})")
        bad = [i for i, x in enumerate(v) if not isinstance(x, bool)]
        if bad:
            raise ValueError(f"{key}[{bad[0]}] is {v[bad[0]]!r}, expected a bool "
                             f"(true: sliding-window layer)")
        return tuple(v)
    period = number(key, v, real=False)
    if not 0 <= period <= MAX_SIZE:
        raise ValueError(f"{key} is {v!r}, expected a bool per layer or a period from 0 to {MAX_SIZE}")
    return period


def _check_rope_scaling(md: dict[str, Any]) -> None:
    """RoPE scaling in llama.cpp touches the global layers, which do not rotate
    here, except through YaRN's magnitude and ``attn_factor``, which would
    rescale the sliding layers: those are refused, naming the key."""
    kind = md.get(f"{ARCH}.rope.scaling.type", "none")
    if kind not in _ROPE_SCALING_TYPES:
        raise ValueError(f"{ARCH}.rope.scaling.type is {kind!r}; muser-torch runs "
                         f"{', '.join(map(repr, _ROPE_SCALING_TYPES))} for {ARCH}")
    key = f"{ARCH}.rope.scaling.attn_factor"
    if key in md and number(key, md[key], real=True) != 1.0:
        raise ValueError(f"{key} is {md[key]!r}; muser-torch runs {ARCH} only with 1.0")


def _vocab_size(md: dict[str, Any]) -> int:
    """The tokenizer's token count; ``vocab_size`` (which must agree) for a
    file without tokens, as llama.cpp sizes a "none" vocabulary."""
    key = f"{ARCH}.vocab_size"
    declared = _one(md, key, 0) if key in md else None
    tokens = md.get("tokenizer.ggml.tokens")
    if isinstance(tokens, (list, tuple)) and tokens:
        if declared is not None and declared != len(tokens):
            raise ValueError(f"{key} is {declared}, but tokenizer.ggml.tokens has "
                             f"{len(tokens)} tokens")
        return len(tokens)
    if declared is None:
        raise KeyError(key)
    return declared


E, P, N = Role.EMBEDDING, Role.PROJECTION, Role.NORM

# llama.cpp's create_tensor list for LLM_ARCH_MUSE_GLIMMER: every tensor required.
TENSORS = tensor_table(
    "token_embd",
    "attn_norm", "attn_q", "attn_k", "attn_v", "attn_q_norm", "attn_k_norm", "attn_gate",
    "attn_output", "post_attention_norm",
    "ffn_norm", "ffn_gate", "ffn_up", "ffn_down", "post_ffw_norm",
    "output_norm",
    "output",   # untied; fenced like any projection
)

# What admission lets through per role for any file (llama.cpp's types, and
# Muser's NVFP4_E2M1 whose lane is checked with the tensors).
FENCES = {P: LLAMA_CPP_TYPES | {GGMLType.NVFP4_E2M1}, E: LLAMA_CPP_TYPES,
          N: frozenset({GGMLType.F32})}
# The Muser-native lanes' fences: what the engine's accelerated path admits
# (docs/muse-glimmer.md, "The lanes and their fences").
LANE_FENCES = {P: frozenset({GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.NVFP4_E2M1,
                             GGMLType.F16}),
               E: frozenset({GGMLType.Q4_K, GGMLType.F16}),
               N: frozenset({GGMLType.F32})}


def check_lane_key(md: dict, where: str) -> None:
    """``muser.weight_precision``, when present, is one of ``LANES``."""
    if LANE_KEY in md and md[LANE_KEY] not in LANES:
        raise LaneError(f"{where}: {LANE_KEY} is {md[LANE_KEY]!r}, expected one of "
                        f"{', '.join(map(repr, LANES))} (or no key: a llama.cpp file)")


def check_lane_tensors(gguf: Any, cfg: GlimmerConfig) -> None:
    """A lane's fences and NVFP4 tensors: ``q4_k_xl`` holds none, ``nvfp4`` at
    least one, each with its companions; a file without a lane holds none."""
    where = gguf.path.name
    lane = cfg.weight_precision
    nvfp4 = [n for n, t in gguf.tensors.items() if t.type_id == GGMLType.NVFP4_E2M1]
    if lane is None and nvfp4:
        raise LaneError(f"{where}: tensor {nvfp4[0]!r} is NVFP4_E2M1 ({len(nvfp4)} NVFP4 tensors) "
                        f"but {LANE_KEY} is missing; a file with NVFP4 tensors declares 'nvfp4'")
    if lane == "q4_k_xl" and nvfp4:
        raise LaneError(f"{where}: {LANE_KEY} is 'q4_k_xl' but tensor {nvfp4[0]!r} is "
                        f"NVFP4_E2M1 ({len(nvfp4)} NVFP4 tensors); the kquant lane admits none")
    if lane is None:
        return
    from .spec import expand
    for name, (spec, _) in expand(MUSE_GLIMMER, cfg).items():
        t = gguf.tensors[name]
        allowed = LANE_FENCES[spec.role]
        if t.qtype not in allowed:
            raise DtypeFenceError(
                f"tensor {name!r}: type {t.type_name} (id {t.type_id}) is not admitted for a "
                f"{spec.role.value}; expected one of {', '.join(sorted(q.name for q in allowed))} "
                f"({LANE_KEY} is {lane!r}; a file without the key admits llama.cpp's types)")
    if lane == "nvfp4":
        if not nvfp4:
            raise LaneError(f"{where}: {LANE_KEY} is 'nvfp4' but no tensor is NVFP4_E2M1")
        for name in nvfp4:
            gguf.companions(name)   # raises CompanionError naming what is wrong


# The converter's side (``MuseGlimmerModel``): each GGUF row's tensor in the
# Hugging Face checkpoint (MuseGlimmerForConditionalGeneration's names;
# ``{i}`` the layer). The q/k norms are not in the checkpoint: the converter
# writes attn_q_norm = qk_scale_factor and attn_k_norm = ones. It adds 1 to
# the rows in NORM_SHIFTED (the checkpoint stores w of ``1 + w``) and
# un-permutes attn_q / attn_k from rotate-half to ggml's interleaved pairs.
HF_NAMES = {
    "token_embd.weight": "model.language_model.embed_tokens.weight",
    "blk.{i}.attn_norm.weight": "model.language_model.layers.{i}.input_layernorm.weight",
    "blk.{i}.attn_q.weight": "model.language_model.layers.{i}.self_attn.q_proj.weight",
    "blk.{i}.attn_k.weight": "model.language_model.layers.{i}.self_attn.k_proj.weight",
    "blk.{i}.attn_v.weight": "model.language_model.layers.{i}.self_attn.v_proj.weight",
    "blk.{i}.attn_gate.weight": "model.language_model.layers.{i}.self_attn.gate_proj.weight",
    "blk.{i}.attn_output.weight": "model.language_model.layers.{i}.self_attn.o_proj.weight",
    "blk.{i}.post_attention_norm.weight":
        "model.language_model.layers.{i}.post_attention_layernorm.weight",
    "blk.{i}.ffn_norm.weight": "model.language_model.layers.{i}.pre_feedforward_layernorm.weight",
    "blk.{i}.ffn_gate.weight": "model.language_model.layers.{i}.mlp.gate_proj.weight",
    "blk.{i}.ffn_up.weight": "model.language_model.layers.{i}.mlp.up_proj.weight",
    "blk.{i}.ffn_down.weight": "model.language_model.layers.{i}.mlp.down_proj.weight",
    "blk.{i}.post_ffw_norm.weight": "model.language_model.layers.{i}.post_feedforward_layernorm.weight",
    "output_norm.weight": "model.language_model.norm.weight",
    "output.weight": "lm_head.weight",
}
SYNTHESIZED = {"blk.{i}.attn_q_norm.weight": "qk_scale_factor", "blk.{i}.attn_k_norm.weight": 1.0}
NORM_SHIFTED = frozenset({"blk.{i}.attn_norm.weight", "blk.{i}.post_attention_norm.weight",
                          "blk.{i}.ffn_norm.weight", "blk.{i}.post_ffw_norm.weight"})
UNPERMUTED = {"blk.{i}.attn_q.weight": "num_attention_heads",
              "blk.{i}.attn_k.weight": "num_key_value_heads"}
# config.json (text_config) -> GGUF key under "muse-glimmer." that the converter writes
HF_KEYS = {
    "max_position_embeddings": "context_length", "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length", "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count", "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length", "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "final_logit_softcapping": "final_logit_softcapping", "output_multiplier": "logit_scale",
    "sliding_window": "attention.sliding_window",
    # also: rope_parameters.rope_theta -> rope.freq_base; head_dim -> attention.value_length;
    # layer_types -> attention.sliding_window_pattern (true where "sliding_attention")
}


# Every <arch>.* key the graph follows: the tables' keys and those read above;
# any other is refused by the loader (it could change the math).
UNDERSTOOD = key_names(DECODER_KEYS, _OWN_KEYS, extra=(
    "attention.key_length", "attention.value_length", "attention.key_length_swa",
    "attention.value_length_swa", "rope.dimension_count", "rope.dimension_count_swa",
    "rope.freq_base_swa", "rope.scaling.type", "rope.scaling.attn_factor", PATTERN_KEY, "vocab_size"))

MUSE_GLIMMER = Architecture(ARCH, "Muse Glimmer", GlimmerConfig, TENSORS, FENCES,
                            check_metadata=check_lane_key, check_tensors=check_lane_tensors,
                            understood=UNDERSTOOD, lanes=LANES)
