"""``convert HF_DIR out.gguf --mmproj``: Muse Glimmer's vision projector file
from a ``MuseGlimmerForConditionalGeneration`` checkpoint, as llama.cpp's
converter writes it with ``--mmproj`` (its ``MuseGlimmerVisionModel`` over
``MmprojModel``); ``arch/glimmer_vision.py`` reads it. What it writes:

* the keys, in the converter's order: ``general.architecture = clip``,
  ``general.type = mmproj``, the naming keys (name from the directory, size
  label from the parameter count), ``general.file_type``,
  ``clip.has_vision_encoder``, ``clip.vision.projection_dim`` (the text
  model's width), ``image_size`` (the position table's side x patch x merge:
  a nominal size, the model takes any), ``patch_size``, ``embedding_length``,
  ``feed_forward_length``, ``block_count``, ``attention.head_count``,
  ``image_mean`` / ``image_std`` (``preprocessor_config.json``),
  ``clip.projector_type``, ``attention.layer_norm_epsilon``,
  ``spatial_merge_size``, ``general.quantization_version``;
* the tensors of ``model.vision_tower.``, ``model.vision_adapter.`` and
  ``model.vision_projection.``, in the checkpoint's order, renamed
  (``MMPROJ_NAMES``); q/k weights and biases un-permuted per head into
  adjacent rotary pairs; the patch embedding's temporal slabs summed into one
  ``(p, p, 3, hidden)`` kernel;
* types: vectors and the position table F32; the patch kernel F16 in an f16
  file and F32 otherwise; every other matrix the file's type (F16, BF16, Q8_0).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import torch

from ..arch.glimmer_vision import PROJECTOR
from ..errors import ConfigMismatchError, RecipeError
from ..formats import GGMLType, quantize
from ..formats.floats import as_float_type
from ..gguf_io import save_gguf
from .checkpoint import Checkpoint
from .rules import permute_rows

__all__ = ["MMPROJ_TYPES", "MMPROJ_NAMES", "convert_mmproj"]

MMPROJ_TYPES = {"f16": GGMLType.F16, "bf16": GGMLType.BF16, "q8_0": GGMLType.Q8_0}
_FILE_TYPE = {"f16": 1, "bf16": 32, "q8_0": 7}        # llama_ftype
_PREFIXES = ("model.vision_tower.", "model.vision_adapter.", "model.vision_projection.")

# transformers' name (after "model.") -> the GGUF name; {i}: the layer
MMPROJ_NAMES = {
    "vision_adapter.fc1.weight": "mm.0.weight",
    "vision_adapter.fc2.weight": "mm.1.weight",
    "vision_projection.weight": "mm.2.weight",
    "vision_tower.patch_embedder.patch_embedding.weight": "v.patch_embd.weight",
    "vision_tower.patch_embedder.position_embedding_table.weight": "v.position_embd.weight",
    "vision_tower.ln_pre.weight": "v.pre_ln.weight", "vision_tower.ln_pre.bias": "v.pre_ln.bias",
    "vision_tower.ln_post.weight": "v.post_ln.weight", "vision_tower.ln_post.bias": "v.post_ln.bias",
    **{f"vision_tower.layers.{{i}}.{hf}.{x}": f"v.blk.{{i}}.{g}.{x}"
       for hf, g in (("norm1", "ln1"), ("norm2", "ln2"), ("attn.q_proj", "attn_q"), ("attn.k_proj", "attn_k"),
                     ("attn.v_proj", "attn_v"), ("attn.proj", "attn_out"), ("mlp.fc1", "ffn_up"),
                     ("mlp.fc2", "ffn_down"))
       for x in ("weight", "bias")},
}
_LAYER = re.compile(r"\.layers\.(\d+)\.")


def _gguf_name(hf_name: str) -> str | None:
    short = hf_name[len("model."):]
    m = _LAYER.search(short)
    key = short if m is None else short[:m.start()] + ".layers.{i}." + short[m.end():]
    name = MMPROJ_NAMES.get(key)
    return None if name is None else name.format(i=m.group(1) if m else "")


def _vision_config(hp: dict) -> dict:
    if "MuseGlimmerForConditionalGeneration" not in (hp.get("architectures") or []):
        raise ConfigMismatchError(f"--mmproj writes Muse Glimmer's vision projector; config.json says "
                                  f"{hp.get('architectures')}")
    vc = hp.get("vision_config")
    if not isinstance(vc, dict):
        raise ConfigMismatchError("config.json has no vision_config: the checkpoint has no vision tower")
    need = ("patch_size", "pos_emb_height", "merge_size", "hidden_size", "intermediate_size",
            "num_hidden_layers", "num_attention_heads", "patch_temporal", "layer_norm_eps")
    missing = [k for k in need if k not in vc]
    if missing:
        raise ConfigMismatchError(f"config.json's vision_config has no {missing[0]!r}")
    return vc


def _metadata(ck: Checkpoint, hp: dict, vc: dict, kind: str, shapes: list[tuple[str, tuple[int, ...]]]
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    import logging
    import json

    import gguf

    from .keys import _to_save_gguf, general_writer
    logging.getLogger("gguf.gguf_writer").setLevel(logging.ERROR)
    pre = ck.dir / "preprocessor_config.json"
    if not pre.is_file():
        raise ConfigMismatchError(f"{ck.dir}: no preprocessor_config.json (image_mean / image_std)")
    pcfg = json.loads(pre.read_text())
    if "image_mean" not in pcfg or "image_std" not in pcfg:
        raise ConfigMismatchError(f"{pre}: no image_mean / image_std")
    w = general_writer(ck, "clip", shapes, gguf.GGUFType.MMPROJ)
    w.add_file_type(_FILE_TYPE[kind])
    w.add_clip_has_vision_encoder(True)
    text = {**hp, **(hp.get("text_config") or {})}
    w.add_vision_projection_dim(text.get("hidden_size", text.get("n_embd", 0)))
    w.add_vision_image_size(vc["pos_emb_height"] * vc["patch_size"] * vc["merge_size"])
    w.add_vision_patch_size(vc["patch_size"])
    w.add_vision_embedding_length(vc["hidden_size"])
    w.add_vision_feed_forward_length(vc["intermediate_size"])
    w.add_vision_block_count(vc["num_hidden_layers"])
    w.add_vision_head_count(vc["num_attention_heads"])
    w.add_vision_image_mean(pcfg["image_mean"])
    w.add_vision_image_std(pcfg["image_std"])
    w.add_clip_projector_type(PROJECTOR)
    w.add_vision_attention_layernorm_eps(float(vc["layer_norm_eps"]))
    w.add_vision_spatial_merge_size(int(vc["merge_size"]))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    return _to_save_gguf(dict(w.kv_data[0]))


def _type_of(name: str, ne: tuple[int, ...], kind: str) -> GGMLType:
    """The converter's choice: vectors and the position table F32; the patch
    kernel F16 in an f16 file, else F32; the rest the file's type, Q8_0
    falling back to F16 for a row that is no multiple of its block."""
    if len(ne) <= 1 or name == "v.position_embd.weight":
        return GGMLType.F32
    if name == "v.patch_embd.weight":
        return GGMLType.F16 if kind == "f16" else GGMLType.F32
    q = MMPROJ_TYPES[kind]
    return GGMLType.F16 if ne[0] % q.block_elems else q


def _encode(t: torch.Tensor, q: GGMLType, ne: tuple[int, ...]) -> torch.Tensor:
    floats = as_float_type(t, q)
    return floats if floats is not None else quantize(t.to(torch.float32).reshape(-1, ne[0]), q)


def convert_mmproj(ck: Checkpoint, out: Path, kind: str, progress: bool | None) -> tuple[int, int]:
    """Write ``out``; returns (tensors written, checkpoint bytes read)."""
    if kind not in MMPROJ_TYPES:
        raise RecipeError(f"--mmproj writes {', '.join(MMPROJ_TYPES)} (as llama.cpp's converter), not {kind}")
    hp = ck.hparams
    vc = _vision_config(hp)
    heads, pt, p = int(vc["num_attention_heads"]), int(vc["patch_temporal"]), int(vc["patch_size"])
    rows: list[tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]] = []
    for hf_name, ref in ck.tensors.items():
        if not hf_name.startswith(_PREFIXES):
            continue
        name = _gguf_name(hf_name)
        if name is None:
            raise ConfigMismatchError(f"tensor {hf_name!r} has no place in Muse Glimmer's projector")
        shape = tuple(ref.shape)
        steps: list[Callable[[torch.Tensor], torch.Tensor]] = []
        if ".attn.q_proj." in hf_name or ".attn.k_proj." in hf_name:
            steps.append(lambda t: permute_rows(t, heads))
        if name == "v.patch_embd.weight":
            n = shape[0]
            if shape != (n, pt * 3 * p * p):
                raise ConfigMismatchError(f"tensor {hf_name!r} has shape {list(shape)}, config.json implies "
                                          f"{[n, pt * 3 * p * p]}")
            steps.append(lambda t, n=n: t.view(n, pt, 3, p, p).sum(dim=1))
            shape = (n, 3, p, p)

        def load(hf_name=hf_name, steps=steps) -> torch.Tensor:
            t = ck.load(hf_name)
            # the converter computes in float16 or float32; other dtypes become float32 first
            t = t if t.dtype in (torch.float16, torch.float32) else t.to(torch.float32)
            for s in steps:
                t = s(t)
            return t
        rows.append((name, tuple(reversed(shape)), load))
    if not rows:
        raise ConfigMismatchError(f"{ck.dir}: the checkpoint has no vision tower tensors")
    metadata, types = _metadata(ck, hp, vc, kind, [(n, ne) for n, ne, _ in rows])
    specs = {}
    for name, ne, load in rows:
        q = _type_of(name, ne, kind)
        specs[name] = (q, lambda load=load, q=q, ne=ne: _encode(load(), q, ne), ne)
    input_bytes = sum(ck.tensors[h].nbytes for h in ck.tensors if h.startswith(_PREFIXES))
    save_gguf(out, metadata, specs, types=types,
              progress=progress if progress is not None else input_bytes >= 64 << 20)
    return len(specs), input_bytes
