"""Muse Glimmer's vision projector file (llama.cpp's ``mmproj``:
``general.architecture = "clip"``, ``clip.projector_type = "muse-glimmer"``),
as llama.cpp's converter writes it (``--mmproj``) and its multimodal library (mtmd) reads it.
The model is ``muser_torch/vision/tower.py``; this module holds the facts:
the keys with their ranges, the tensor table, the fences and the admission.

What the file does not carry, llama.cpp fixes and so do we (``clip.cpp``):
the rotary base (10000, transformers' default too), the temporal patch (2)
and the layer pattern (full attention on every 4th layer and the last,
windowed attention elsewhere). The window is the position table's side in
patches, as in both implementations.

The converter's edits, which the model undoes or follows:
* ``v.patch_embd.weight`` is transformers' ``patch_embedding`` (a linear map of
  ``temporal x 3 x p x p`` pixels) with its two temporal slabs *summed* into one
  conv2d kernel ``(p, p, 3, hidden)``: an image repeats its frame over the
  temporal patch, so the sum is exact for images; two different frames in one
  temporal group cannot be told apart through this file (``docs/muse-glimmer.md``).
* q and k (weights and biases) are un-permuted per head from rotate-half order
  into ggml's adjacent pairs: pair j of a head is rows (2j, 2j + 1).
* the adapter's fc1, fc2 and the text model's ``vision_projection`` are
  ``mm.0``, ``mm.1``, ``mm.2`` (no biases).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..errors import DtypeFenceError, MetadataError, ShapeMismatchError, TensorSetError, VisionMismatchError
from ..formats import GGMLType
from .spec import LLAMA_CPP_TYPES, MAX_SIZE, number

__all__ = ["VisionConfig", "PROJECTOR", "ROPE_BASE", "TEMPORAL_PATCH", "tensor_table", "admit_mmproj",
           "release_config", "mmproj_metadata"]

PROJECTOR = "muse-glimmer"
ROPE_BASE = 10000.0         # clip.cpp: hparams.rope_theta for PROJECTOR_TYPE_MUSE_GLIMMER
TEMPORAL_PATCH = 2          # clip.cpp: muse_glimmer_patch_temporal
FULL_EVERY = 4              # clip.cpp: muse_glimmer_sparse_factor (3 windowed + 1 full)
_V = "clip.vision."


@dataclass(frozen=True)
class VisionConfig:
    hidden: int               # clip.vision.embedding_length
    ffn: int                  # clip.vision.feed_forward_length
    n_layers: int             # clip.vision.block_count
    n_heads: int              # clip.vision.attention.head_count
    patch_size: int           # clip.vision.patch_size
    merge: int                # clip.vision.spatial_merge_size (2x2 pixel shuffle)
    eps: float                # clip.vision.attention.layer_norm_epsilon (every LayerNorm)
    text_hidden: int          # clip.vision.projection_dim: mm.2's output, the text model's width
    adapter_hidden: int       # mm.0's output (from the tensor; no key carries it)
    pos_side: int             # the position table is pos_side x pos_side rows
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def merged_width(self) -> int:
        return self.hidden * self.merge * self.merge

    @property
    def patch_pixels(self) -> int:
        return 3 * self.patch_size * self.patch_size

    def is_full(self, layer: int) -> bool:
        """Full attention (over a whole frame) on this layer, else windowed."""
        return (layer + 1) % FULL_EVERY == 0 or layer == self.n_layers - 1


def release_config(text_hidden: int, n_layers: int = 50) -> VisionConfig:
    """The released tower's geometry (transformers' MuseGlimmerVisionConfig
    defaults; its adapter width MuseGlimmerConfig.projector_hidden_size; the
    processors' IMAGENET_STANDARD mean and std), ``n_layers`` of its 50, into
    a text model ``text_hidden`` wide."""
    return VisionConfig(hidden=1536, ffn=8960, n_layers=n_layers, n_heads=16, patch_size=14, merge=2,
                        eps=1e-5, text_hidden=text_hidden, adapter_hidden=4096, pos_side=32,
                        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))


def mmproj_metadata(cfg: VisionConfig, file_type: int, name: str) -> dict[str, Any]:
    """The keys of a projector of ``cfg``, those llama.cpp's converter writes
    (``convert/mmproj.py``) and in its order, less the size label;
    ``file_type`` is llama.cpp's ftype (1: mostly F16, 7: Q8_0)."""
    return {
        "general.architecture": "clip", "general.type": "mmproj", "general.name": name,
        "general.file_type": file_type, "clip.has_vision_encoder": True,
        _V + "projection_dim": cfg.text_hidden,
        _V + "image_size": cfg.pos_side * cfg.patch_size * cfg.merge,   # nominal: any size is taken
        _V + "patch_size": cfg.patch_size, _V + "embedding_length": cfg.hidden,
        _V + "feed_forward_length": cfg.ffn, _V + "block_count": cfg.n_layers,
        _V + "attention.head_count": cfg.n_heads, _V + "image_mean": list(cfg.image_mean),
        _V + "image_std": list(cfg.image_std), "clip.projector_type": PROJECTOR,
        _V + "attention.layer_norm_epsilon": cfg.eps, _V + "spatial_merge_size": cfg.merge,
        "general.quantization_version": 2,
    }


# GGUF name, ne in config terms, role. Roles: "patch" (a float matrix: its row of
# 3*p*p is no block format's multiple), "position" (a packed table read by rows),
# "projection" (packed matrices), "vector" (LayerNorm weights and biases, biases).
_GLOBAL_ROWS = (
    ("v.patch_embd.weight", ("patch_size", "patch_size", 3, "hidden"), "patch"),
    ("v.position_embd.weight", ("hidden", "pos_rows"), "position"),
    ("v.pre_ln.weight", ("hidden",), "vector"),
    ("v.pre_ln.bias", ("hidden",), "vector"),
)
_LAYER_ROWS = (
    ("ln1.weight", ("hidden",), "vector"), ("ln1.bias", ("hidden",), "vector"),
    ("attn_q.weight", ("hidden", "hidden"), "projection"), ("attn_q.bias", ("hidden",), "vector"),
    ("attn_k.weight", ("hidden", "hidden"), "projection"), ("attn_k.bias", ("hidden",), "vector"),
    ("attn_v.weight", ("hidden", "hidden"), "projection"), ("attn_v.bias", ("hidden",), "vector"),
    ("attn_out.weight", ("hidden", "hidden"), "projection"), ("attn_out.bias", ("hidden",), "vector"),
    ("ln2.weight", ("hidden",), "vector"), ("ln2.bias", ("hidden",), "vector"),
    ("ffn_up.weight", ("hidden", "ffn"), "projection"), ("ffn_up.bias", ("ffn",), "vector"),
    ("ffn_down.weight", ("ffn", "hidden"), "projection"), ("ffn_down.bias", ("hidden",), "vector"),
)
_TAIL_ROWS = (
    ("v.post_ln.weight", ("hidden",), "vector"),
    ("v.post_ln.bias", ("hidden",), "vector"),
    ("mm.0.weight", ("merged_width", "adapter_hidden"), "projection"),
    ("mm.1.weight", ("adapter_hidden", "adapter_hidden"), "projection"),
    ("mm.2.weight", ("adapter_hidden", "text_hidden"), "projection"),
)

FLOATS = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16})
FENCES = {"patch": FLOATS, "position": LLAMA_CPP_TYPES, "projection": LLAMA_CPP_TYPES, "vector": FLOATS}


def tensor_table(cfg: VisionConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every tensor of a projector of ``cfg``, in the converter's order: name -> (ne, role)."""
    attrs = {**cfg.__dict__, "merged_width": cfg.merged_width, "pos_rows": cfg.pos_side ** 2}

    def ne(dims):
        return tuple(d if isinstance(d, int) else int(attrs[d]) for d in dims)
    out = {name: (ne(d), role) for name, d, role in _GLOBAL_ROWS}
    for il in range(cfg.n_layers):
        out |= {f"v.blk.{il}.{name}": (ne(d), role) for name, d, role in _LAYER_ROWS}
    out |= {name: (ne(d), role) for name, d, role in _TAIL_ROWS}
    return out


def _int(md: dict, key: str, lo: int = 1, hi: int = MAX_SIZE, default: int | None = None) -> int:
    if key not in md:
        if default is None:
            raise MetadataError(f"metadata key {key!r} is missing")
        return default
    try:
        v = number(key, md[key], real=False)
    except ValueError as e:
        raise MetadataError(str(e)) from None
    if not lo <= v <= hi:
        raise MetadataError(f"{key} is {v}, expected an integer from {lo} to {hi}")
    return v


def _triple(md: dict, key: str, positive: bool) -> tuple[float, float, float]:
    v = md.get(key)
    if not isinstance(v, (list, tuple)) or len(v) != 3:
        raise MetadataError(f"{key} is {v!r}, expected 3 numbers (one per RGB channel)")
    out = tuple(number(f"{key}[{i}]", x, real=True) for i, x in enumerate(v))
    if not all(math.isfinite(x) and (x > 0 or not positive) for x in out):
        raise MetadataError(f"{key} is {list(out)}, expected finite{' positive' if positive else ''} numbers")
    return out  # type: ignore[return-value]


def admit_mmproj(gguf: Any, text_hidden: int | None = None) -> VisionConfig:
    """The projector's config, once every key, tensor, type and shape passed;
    else an AdmissionError naming what is wrong (a ``VisionMismatchError`` for a
    file that is no Muse Glimmer projector, or one for a text model of another
    width than ``text_hidden``)."""
    md, where = gguf.metadata, gguf.path.name
    arch, proj = md.get("general.architecture"), md.get("clip.projector_type")
    if arch != "clip" or proj != PROJECTOR:
        raise VisionMismatchError(
            f"{where}: general.architecture is {arch!r} and clip.projector_type {proj!r}; a Muse "
            f"Glimmer vision projector has 'clip' and {PROJECTOR!r}")
    if md.get("clip.has_vision_encoder") is not True:
        raise MetadataError(f"{where}: clip.has_vision_encoder is {md.get('clip.has_vision_encoder')!r}, "
                            f"expected true")
    try:
        hidden = _int(md, _V + "embedding_length")
        n_heads = _int(md, _V + "attention.head_count", hi=hidden)
        eps = number(_V + "attention.layer_norm_epsilon", md.get(_V + "attention.layer_norm_epsilon"), True)
        if not 0 < eps < 1:
            raise MetadataError(f"{_V}attention.layer_norm_epsilon is {eps}, expected a number in (0, 1)")
        pos = gguf.tensors.get("v.position_embd.weight")
        mm0 = gguf.tensors.get("mm.0.weight")
        if pos is None or mm0 is None:
            raise TensorSetError(f"{where}: missing tensor "
                                 f"{'v.position_embd.weight' if pos is None else 'mm.0.weight'!r}")
        side = math.isqrt(pos.n_out)
        if side * side != pos.n_out:
            raise ShapeMismatchError(f"tensor 'v.position_embd.weight': {pos.n_out} rows, expected a "
                                     f"square grid of positions")
        cfg = VisionConfig(
            hidden=hidden, ffn=_int(md, _V + "feed_forward_length"), n_layers=_int(md, _V + "block_count"),
            n_heads=n_heads, patch_size=_int(md, _V + "patch_size", hi=1024),
            merge=_int(md, _V + "spatial_merge_size", hi=16, default=2), eps=eps,
            text_hidden=_int(md, _V + "projection_dim"), adapter_hidden=mm0.n_out, pos_side=side,
            image_mean=_triple(md, _V + "image_mean", False), image_std=_triple(md, _V + "image_std", True))
    except ValueError as e:
        if isinstance(e, MetadataError) or not isinstance(e, ValueError):
            raise
        raise MetadataError(f"{where}: {e}") from None
    if hidden % n_heads or cfg.head_dim % 4:
        # the 2-D rotary splits each head into a width half and a height half of pairs
        raise MetadataError(f"{where}: head size {hidden}/{n_heads} is not a multiple of 4 (the axial "
                            f"rotary needs a width half and a height half of pairs)")
    if text_hidden is not None and cfg.text_hidden != text_hidden:
        raise VisionMismatchError(
            f"{where}: the projector's output (clip.vision.projection_dim, mm.2) is {cfg.text_hidden} "
            f"wide, but the text model's embedding_length is {text_hidden}: another model's mmproj")
    expected = tensor_table(cfg)
    missing = [n for n in expected if n not in gguf.tensors]
    if missing:
        raise TensorSetError(f"{where}: missing tensor {missing[0]!r}"
                             + (f" and {len(missing) - 1} more" if len(missing) > 1 else "")
                             + f" (a {cfg.n_layers}-layer Muse Glimmer projector has {len(expected)})")
    extra = [n for n in gguf.tensors if n not in expected]
    if extra:
        raise TensorSetError(f"{where}: unexpected tensor {extra[0]!r}; the Muse Glimmer projector "
                             f"does not use it")
    for name, (ne, role) in expected.items():
        t = gguf.tensors[name]
        if t.qtype not in FENCES[role]:
            raise DtypeFenceError(f"tensor {name!r}: type {t.type_name} is not admitted for a {role}; "
                                  f"expected one of {', '.join(sorted(q.name for q in FENCES[role]))}")
        if tuple(t.ne) != ne:
            raise ShapeMismatchError(f"tensor {name!r}: ne {list(t.ne)} but the config expects {list(ne)}")
    return cfg
