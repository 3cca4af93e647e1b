"""A Hugging Face checkpoint directory, read the way llama.cpp's converter reads it:
config.json through transformers' ``AutoConfig`` (so defaults the class fills
in are seen), the ``model*.safetensors`` parts (those the
``model.safetensors.index.json`` weight map names, else every part), and
their tensors in the converter's order: parts sorted by file name, tensors
sorted by name within a part.

Tensors are memory-mapped through the ``safetensors`` package and loaded
one at a time (``Checkpoint.load``), so the process holds one tensor in
memory, never the model. Every problem found is a ``CheckpointError`` naming
the file: a missing part or config, a truncated or malformed part, a weight
map that disagrees with the parts.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..errors import CheckpointError

INDEX_NAME = "model.safetensors.index.json"

# safetensors dtype names -> bytes per element (what the header's offsets must cover)
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
                "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "U16": 2, "U32": 4, "U64": 8}


@dataclass(frozen=True)
class TensorRef:
    name: str
    part: Path
    dtype: str                 # safetensors' name: "BF16", "F32", "U8", "F8_E4M3" ...
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * _DTYPE_BYTES.get(self.dtype, 1)


class Checkpoint:
    """The config and the tensor index of a checkpoint directory (nothing loaded yet)."""

    def __init__(self, directory: "str | Path"):
        self.dir = Path(directory)
        if not self.dir.is_dir():
            raise CheckpointError(f"{self.dir}: not a directory (expected a Hugging Face checkpoint)")
        self.hparams = load_hparams(self.dir)
        self.tensors: dict[str, TensorRef] = {}
        for part in self._parts():
            for ref in _read_header(part):
                self.tensors[ref.name] = ref

    def _parts(self) -> list[Path]:
        index = self.dir / INDEX_NAME
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map")
            except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
                raise CheckpointError(f"{index}: not a valid weight map ({e})") from None
            if not isinstance(weight_map, dict) or not weight_map:
                raise CheckpointError(f"{index}: 'weight_map' is missing or empty")
            names = sorted(set(map(str, weight_map.values())))
            missing = [n for n in names if not (self.dir / n).is_file()]
            if missing:
                raise CheckpointError(f"{self.dir}: {INDEX_NAME} names {len(names)} shard(s) but "
                                      f"{len(missing)} are missing: {', '.join(missing)}")
            self._weight_map = weight_map
            return [self.dir / n for n in names]
        self._weight_map = None
        parts = sorted(p for p in self.dir.iterdir()
                       if p.name.startswith("model") and p.name.endswith(".safetensors"))
        if not parts:
            raise CheckpointError(f"{self.dir}: no model*.safetensors file")
        return parts

    def check_weight_map(self) -> None:
        """The index's tensor names are exactly the parts' (the converter's check)."""
        if self._weight_map is None:
            return
        listed, found = set(self._weight_map), set(self.tensors)
        if listed != found:
            missing, extra = sorted(listed - found), sorted(found - listed)
            raise CheckpointError(f"{self.dir / INDEX_NAME}: the weight map and the shards disagree; "
                                  f"missing from the shards: {missing[:5]}{' ...' if len(missing) > 5 else ''}, "
                                  f"not in the map: {extra[:5]}{' ...' if len(extra) > 5 else ''}")

    def load(self, name: str) -> torch.Tensor:
        """Tensor ``name`` from its memory-mapped part (a copy of this tensor
        only). The map is opened per tensor and closed after it, so the pages
        read do not stay resident: memory holds this tensor, not the part."""
        from safetensors import safe_open
        ref = self.tensors[name]
        try:
            with safe_open(str(ref.part), framework="pt") as f:
                return f.get_tensor(name)
        except Exception as e:    # safetensors raises its own SafetensorError
            raise CheckpointError(f"{ref.part.name}: tensor {name!r} cannot be read ({e})") from None

    def close(self) -> None:
        """Nothing stays open between loads; kept so callers need not know."""


def load_hparams(directory: Path) -> dict[str, Any]:
    """config.json as transformers' config class sees it (its defaults filled in),
    falling back to the JSON itself when transformers does not know the class,
    as the converter does."""
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: config.json is missing")
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(raw).__name__}")
    try:
        from transformers import AutoConfig
        return AutoConfig.from_pretrained(str(directory), trust_remote_code=False).to_dict()
    except ImportError:
        raise CheckpointError('converting needs transformers (pip install -e ".[hf]")') from None
    except Exception:   # an unknown model_type: the JSON, as the converter falls back to
        return raw


def _read_header(part: Path) -> list[TensorRef]:
    """The tensors a safetensors file declares, checked against the file's size
    (a truncated file is refused here, before anything is converted)."""
    size = part.stat().st_size
    with open(part, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{part.name}: truncated safetensors file ({size} bytes, no header)")
        n = int.from_bytes(head, "little")
        if n > size - 8 or n > 100 << 20:
            raise CheckpointError(f"{part.name}: truncated or not safetensors (header of {n} bytes "
                                  f"in a file of {size})")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{part.name}: malformed safetensors header ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{part.name}: malformed safetensors header")
    refs, end = [], 0
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (lo, hi) = meta["dtype"], tuple(int(d) for d in meta["shape"]), meta["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{part.name}: malformed entry for tensor {name!r}") from None
        ref = TensorRef(name, part, str(dtype), shape)
        if hi - lo != ref.nbytes or lo < 0:
            raise CheckpointError(f"{part.name}: tensor {name!r} {dtype} {list(shape)} should span "
                                  f"{ref.nbytes} bytes, its offsets give {hi - lo}")
        end = max(end, hi)
        refs.append(ref)
    if 8 + n + end > size:
        raise CheckpointError(f"{part.name}: truncated: its tensors need {8 + n + end} bytes, "
                              f"the file has {size}")
    return sorted(refs, key=lambda r: r.name)
