"""A random Muse Glimmer vision projector file (``mmproj``) of any geometry,
the released one by default (``arch/glimmer_vision.py``'s ``release_config``):
the keys and tensors llama.cpp's converter writes, random values, so that
muser-torch and llama.cpp's ``llama-mtmd-cli`` can be timed on the same file
beside a ``make-tiny`` text model of the same width.

Values: matrices normal / sqrt(inputs) (the tower's activations stay of
order one through its layers), LayerNorm weights near 1, biases and the
position table small. Types as the converter's: vectors and the position
table F32, the patch kernel F16 in an f16 file and F32 otherwise, the other
matrices the file's type."""
from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from ..arch.glimmer_vision import VisionConfig, mmproj_metadata, tensor_table
from ..formats import GGMLType, quantize
from ..formats.floats import as_float_type
from ..gguf_io import save_gguf

__all__ = ["MMPROJ_KINDS", "write_random_mmproj", "mmproj_bytes"]

# file type name -> (matrix type, llama.cpp's ftype)
MMPROJ_KINDS = {"f16": (GGMLType.F16, 1), "q8_0": (GGMLType.Q8_0, 7)}
_LN_WEIGHTS = ("ln1.weight", "ln2.weight", "pre_ln.weight", "post_ln.weight")


def _type_of(name: str, ne: tuple[int, ...], role: str, kind: str) -> GGMLType:
    if role in ("vector", "position"):
        return GGMLType.F32
    if role == "patch":
        return GGMLType.F16 if kind == "f16" else GGMLType.F32
    return MMPROJ_KINDS[kind][0]


def _values(name: str, ne: tuple[int, ...], role: str, gen: torch.Generator) -> torch.Tensor:
    n_in = ne[0] if role != "patch" else math.prod(ne[:3])
    z = torch.randn(tuple(reversed(ne)), generator=gen)
    if role == "vector":
        return 1.0 + 0.1 * z if name.endswith(_LN_WEIGHTS) else 0.02 * z
    if role == "position":
        return 0.02 * z
    return z / math.sqrt(n_in)


def mmproj_bytes(cfg: VisionConfig, kind: str) -> int:
    """The tensor bytes of a projector of ``cfg`` in ``kind``."""
    return sum(_type_of(n, ne, role, kind).row_bytes(ne[0]) * math.prod(ne[1:])
               for n, (ne, role) in tensor_table(cfg).items())


def write_random_mmproj(path: "str | os.PathLike[str]", cfg: VisionConfig, kind: str = "f16",
                        seed: int = 0, progress: bool | None = None) -> Path:
    """Write the projector; one tensor is held at a time."""
    if kind not in MMPROJ_KINDS:
        raise ValueError(f"mmproj type {kind!r}: expected one of {', '.join(MMPROJ_KINDS)}")
    gen = torch.Generator().manual_seed(seed)
    specs = {}
    for name, (ne, role) in tensor_table(cfg).items():
        q = _type_of(name, ne, role, kind)

        def make(name=name, ne=ne, role=role, q=q) -> torch.Tensor:
            t = _values(name, ne, role, gen)     # drawn in the table's order, as written
            floats = as_float_type(t, q)
            return floats if floats is not None else quantize(t.reshape(-1, ne[0]), q)
        specs[name] = (q, make, ne)
    md = mmproj_metadata(cfg, MMPROJ_KINDS[kind][1], f"muse-glimmer-random-mmproj-seed{seed}")
    save_gguf(path, md, specs, progress=progress)
    return Path(path)
