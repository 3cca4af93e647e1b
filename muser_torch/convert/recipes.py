"""Which GGML type each tensor of a converted file gets, per ``--type``.

* ``f16``, ``bf16``, ``q8_0``: llama.cpp's converter (``prepare_tensors``):
  1-D tensors, ``*_norm.weight`` and anything not named ``*.weight`` stay
  F32; every other tensor takes the type, Q8_0 falling back to F16 where a
  row is not whole 32-blocks.
* ``q4_k_m``, ``q3_k_m``, ``q2_k``: what ``llama-quantize`` makes of the
  converter's F16 file (``llama_tensor_get_type`` in ``src/llama-quant.cpp``):
  the ftype's type by default (Q4_K, Q3_K, Q2_K); the lm_head (or the
  embedding, when tied) Q6_K, Q8_0 when its rows are not whole 256-blocks;
  then per ftype (``_llama_quantize_type``):
    q4_k_m  attn_v, ffn_down Q6_K on the ``use_more_bits`` layers;
    q3_k_m  attn_v Q5_K on the first two layers, Q4_K after; ffn_down Q5_K
            on the first n_layers/16, Q4_K after; attn_output Q4_K;
    q2_k    attn_v Q4_K when n_head / n_head_kv >= 4, else Q3_K; ffn_down
            and attn_output Q3_K;
  then the fallbacks for rows not divisible by 256 (Q2_K, Q3_K -> Q4_0,
  Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, F16 when not even 32 divides
  them). llama.cpp's MoE, Falcon and 70B-model exceptions are not taken:
  the architectures converted here have none of them.
* ``iq4_xs``, ``iq4_nl``, ``mxfp4``: ``llama-quantize``'s IQ4_XS, IQ4_NL and
  MXFP4_MOE over the converter's F16 file, without an importance matrix
  (``plan_lookup``).
* ``q4_k_xl``, ``nvfp4``: the Muser lanes (``arch/glimmer_recipe``, docs/muse-glimmer.md),
  for an architecture whose table has them (``Architecture.lanes``: Muse
  Glimmer's); a tensor whose rows cannot take the lane's type is refused
  (RecipeError).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..arch.glimmer_recipe import recipe_type
from ..arch.muse_glimmer import LANES
from ..errors import RecipeError
from ..formats import GGMLType

T = GGMLType
# llama-quantize's K-quant ftypes made from the converter's F16 file, and each one's default type.
LLAMA_QUANTIZE = {"q4_k_m": T.Q4_K, "q3_k_m": T.Q3_K, "q2_k": T.Q2_K}
# The lookup-table recipes (llama-quantize ftypes) and the llama.cpp ftype each writes.
LOOKUP_KINDS = {"iq4_nl": (T.IQ4_NL, 25), "iq4_xs": (T.IQ4_XS, 30), "mxfp4": (T.MXFP4, 38)}
TYPES = ("f16", "bf16", "q8_0", "q4_k_m") + LANES + ("q3_k_m", "q2_k") + tuple(LOOKUP_KINDS)
# The kinds made by llama-quantize from the converter's F16 file.
FROM_F16 = tuple(LLAMA_QUANTIZE) + tuple(LOOKUP_KINDS)

# general.file_type (llama.cpp's llama_ftype) each --type writes; the lanes have
# none of their own in llama.cpp, so they say what most of their bytes are
# (Q4_K_M for q4_k_xl, llama.cpp's MOSTLY_NVFP4 for nvfp4).
FILE_TYPES = {"f16": 1, "bf16": 32, "q8_0": 7, "q4_k_m": 15, "q4_k_xl": 15, "nvfp4": 39,
              "q3_k_m": 12, "q2_k": 10}
FILE_TYPES |= {kind: ftype for kind, (_, ftype) in LOOKUP_KINDS.items()}
_CONVERTER_TYPE = {"f16": T.F16, "bf16": T.BF16, "q8_0": T.Q8_0}


@dataclass(frozen=True)
class _Lane:
    """What ``recipe_type`` reads of a Glimmer config: only its lane."""
    weight_precision: str


def lane_type(lane: str, name: str) -> GGMLType:
    """The Muser lane's recipe (``arch/glimmer_recipe``) for tensor ``name`` in ``lane``."""
    return recipe_type(_Lane(lane), name)


def converter_type(name: str, n_dims: int, n_in: int, kind: str) -> GGMLType:
    """The type llama.cpp's converter writes for ``--outtype kind`` (f16/bf16/q8_0)."""
    if n_dims <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return T.F32
    t = _CONVERTER_TYPE[kind]
    if n_in % t.block_elems:      # gguf-py's QuantError: the converter falls back to F16
        return T.F16
    return t


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _fallback(t: GGMLType, n_in: int) -> GGMLType:
    if n_in % t.block_elems == 0:
        return t
    t = {T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0, T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0,
         T.IQ4_XS: T.IQ4_NL}.get(t, t)
    return t if n_in % t.block_elems == 0 else T.F16


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    ne: tuple[int, ...]         # GGUF order: ne[0] is a row
    qtype: GGMLType
    source_type: GGMLType       # the F16-file type it is made from (FROM_F16 kinds), else qtype


def llama_quantize_order(name: str) -> tuple[int, str]:
    """The order llama-quantize writes tensors in (its loader's weight map):
    by layer, tensors outside any layer first, then by name."""
    parts = name.split(".")
    layer = int(parts[1]) if parts[0] == "blk" and len(parts) > 1 and parts[1].isdecimal() else -1
    return layer, name


def _quantizable(name: str, n_dims: int) -> bool:
    """llama-quantize's tensor_allows_quantization, for the tensors of these architectures."""
    return n_dims >= 2 and name.endswith("weight") and "_norm.weight" not in name


def plan_types(tensors: Sequence[tuple[str, tuple[int, ...]]], kind: str, n_layers: int,
               packed: frozenset[str] = frozenset(), n_gqa: int = 1) -> list[PlannedTensor]:
    """Every tensor's type, in file order (``tensors``: GGUF name, ne). ``packed``:
    the weights an NVFP4 checkpoint holds packed (they stay NVFP4_E2M1; its
    16-bit tensors then follow the q4_k_xl recipe). ``n_gqa``: attention heads
    per key/value head (llama.cpp's ``n_gqa()``; the IQ4 recipes read it)."""
    if kind not in TYPES:
        raise RecipeError(f"--type {kind!r} is not one of {', '.join(TYPES)}")
    if kind in LOOKUP_KINDS:
        return plan_lookup(tensors, kind, n_layers, n_gqa)
    out = []
    if kind in _CONVERTER_TYPE:
        for name, ne in tensors:
            t = converter_type(name, len(ne), ne[0], kind)
            out.append(PlannedTensor(name, ne, t, t))
        return out
    if kind in LANES:
        for name, ne in tensors:
            base = converter_type(name, len(ne), ne[0], "f16")
            lane = "q4_k_xl" if packed and name not in packed else kind
            t = T.NVFP4_E2M1 if name in packed else base if base == T.F32 else lane_type(lane, name)
            if ne[0] % t.block_elems:
                raise RecipeError(f"tensor {name!r}: rows of {ne[0]} elements cannot be {t.name} "
                                  f"(blocks of {t.block_elems}) as the {kind} recipe asks")
            out.append(PlannedTensor(name, ne, t, base))
        return out
    # q4_k_m, q3_k_m, q2_k: llama-quantize over the converter's F16 file
    names = [n for n, _ in tensors]
    shapes = dict(tensors)
    tied = "output.weight" not in names
    n_attn_v = sum("attn_v.weight" in n for n in names)
    # llama.cpp's n_gqa() (layer 0's n_head / n_head_kv), from the q and k rows
    q, k = shapes.get("blk.0.attn_q.weight"), shapes.get("blk.0.attn_k.weight")
    n_gqa = q[1] // k[1] if q and k else 1
    counts = {"attn_v": 0, "ffn_down": 0}
    for name, ne in tensors:
        base = converter_type(name, len(ne), ne[0], "f16")
        if not _quantizable(name, len(ne)):
            out.append(PlannedTensor(name, ne, base, base))
            continue
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            t = T.Q8_0 if ne[0] % LLAMA_QUANTIZE[kind].block_elems else T.Q6_K
        else:
            t = _llama_quantize_type(kind, name, counts, n_attn_v, n_layers, n_gqa)
        out.append(PlannedTensor(name, ne, _fallback(t, ne[0]), base))
    return out


# llama_tensor_get_type_impl's exceptions per ftype: the type of the i-th attn_v
# tensor (of n; g = n_head / n_head_kv), of the i-th ffn_down (of n layers) and of
# attn_output. None keeps the ftype's default.
_ATTN_V = {"q4_k_m": lambda i, n, g: T.Q6_K if _use_more_bits(i, n) else None,
           "q3_k_m": lambda i, n, g: T.Q5_K if i < 2 else T.Q4_K,
           "q2_k": lambda i, n, g: T.Q4_K if g >= 4 else T.Q3_K}
_FFN_DOWN = {"q4_k_m": lambda i, n: T.Q6_K if _use_more_bits(i, n) else None,
             "q3_k_m": lambda i, n: T.Q5_K if i < n // 16 else T.Q4_K,
             "q2_k": lambda i, n: T.Q3_K}
_ATTN_OUTPUT = {"q3_k_m": T.Q4_K, "q2_k": T.Q3_K}


def _llama_quantize_type(kind: str, name: str, counts: dict[str, int], n_attn_v: int,
                         n_layers: int, n_gqa: int) -> GGMLType:
    """llama_tensor_get_type_impl for one tensor (not the lm_head) of ftype
    ``kind``; ``counts`` holds the attn_v and ffn_down tensors seen so far."""
    t = None
    if "attn_v.weight" in name:
        t = _ATTN_V[kind](counts["attn_v"], n_attn_v, n_gqa)
        counts["attn_v"] += 1
    elif "attn_output.weight" in name:
        t = _ATTN_OUTPUT.get(kind)
    elif "ffn_down" in name:
        t = _FFN_DOWN[kind](counts["ffn_down"], n_layers)
        counts["ffn_down"] += 1
    return t or LLAMA_QUANTIZE[kind]


def plan_lookup(tensors: Sequence[tuple[str, tuple[int, ...]]], kind: str, n_layers: int,
                n_gqa: int) -> list[PlannedTensor]:
    """llama-quantize's IQ4_NL, IQ4_XS and MXFP4_MOE over the converter's F16
    file, without an imatrix (``llama_tensor_get_type_impl``):

    * the lm_head (or the tied embedding): Q8_0 for MXFP4_MOE or rows not
      whole blocks of the default type, else Q6_K;
    * MXFP4_MOE: every other quantizable tensor Q8_0, as only 3-D expert
      tensors take MXFP4 and these architectures have none;
    * IQ4_NL / IQ4_XS: attn_v Q5_K when n_gqa >= 4; ffn_down Q5_K on the first
      n_layers / 8 layers; everything else the default type;
    * then the fallbacks for rows that are not whole blocks (IQ4_XS -> IQ4_NL,
      Q5_K -> Q5_1, Q6_K -> Q8_0; F16 where not even 32 divides them)."""
    default = LOOKUP_KINDS[kind][0]
    names = [n for n, _ in tensors]
    tied = "output.weight" not in names
    out, i_ffn_down = [], 0
    for name, ne in tensors:
        base = converter_type(name, len(ne), ne[0], "f16")
        if not _quantizable(name, len(ne)):
            out.append(PlannedTensor(name, ne, base, base))
            continue
        t = default
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            t = T.Q8_0 if kind == "mxfp4" or ne[0] % default.block_elems else T.Q6_K
        elif kind == "mxfp4":
            t = T.Q8_0
        elif "attn_v.weight" in name:
            t = T.Q5_K if n_gqa >= 4 else default
        elif "ffn_down" in name:
            t = T.Q5_K if i_ffn_down < n_layers // 8 else default
            i_ffn_down += 1
        out.append(PlannedTensor(name, ne, _fallback(t, ne[0]), base))
    return out
