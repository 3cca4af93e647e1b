"""Split GGUF files: one model written as parts ``<prefix>-00001-of-0000N.gguf``
... ``<prefix>-0000N-of-0000N.gguf`` (llama.cpp's ``gguf-split`` and gguf-py's
writer with ``split_max_tensors`` / ``split_max_size``).

The facts, as llama.cpp's loader reads them:

- every part carries ``split.no`` (UINT16, 0-based), ``split.count`` (UINT16,
  the number of parts) and ``split.tensors.count`` (INT32, the tensors of all
  parts together);
- the first part (``split.no`` 0) carries the model's metadata; the others
  carry their tensors and the three split keys;
- part ``i`` is named ``<prefix>-%05d-of-%05d.gguf`` with ``i + 1`` and the
  count, and a model is opened by naming its first part;
- no tensor name appears in two parts.

``join`` checks all of that and returns one ``GGUFFile`` whose tensors view
each part's own memory map (nothing is copied) and whose metadata is the first
part's without the split keys, i.e. what the unsplit file would hold.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable

from ..errors import SplitFileError
from .records import GGUFFile, GGUFTensor

__all__ = ["SPLIT_NO", "SPLIT_COUNT", "SPLIT_TENSORS_COUNT", "SPLIT_KEYS", "part_path",
           "is_split", "join"]

SPLIT_NO = "split.no"
SPLIT_COUNT = "split.count"
SPLIT_TENSORS_COUNT = "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS_COUNT)
_U16_MAX = (1 << 16) - 1
_PART_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def part_path(prefix: Path, index: int, count: int) -> Path:
    """The name of part ``index`` (0-based) of ``count``: llama.cpp's ``llama_split_path``."""
    return prefix.with_name(f"{prefix.name}-{index + 1:05d}-of-{count:05d}.gguf")


def is_split(gguf: GGUFFile) -> bool:
    """Whether the file says it is one part of several (``split.count`` > 1)."""
    count = gguf.metadata.get(SPLIT_COUNT)
    return isinstance(count, int) and not isinstance(count, bool) and count > 1


def join(first: GGUFFile, open_part: Callable[[Path], GGUFFile]) -> GGUFFile:
    """All parts of the split model whose first part is ``first``, as one file.
    ``open_part`` parses one part (zero copy). Raises ``SplitFileError`` naming
    the part that is missing or does not belong."""
    count = _split_int(first, SPLIT_COUNT, 2, _U16_MAX)
    no = _split_int(first, SPLIT_NO, 0, _U16_MAX)
    total = _split_int(first, SPLIT_TENSORS_COUNT, 0, (1 << 31) - 1)
    match = _PART_NAME.match(first.path.name)
    if no != 0:
        hint = ""
        if match:
            hint = f"; open the first part, {part_path(first.path.with_name(match['prefix']), 0, count).name}"
        raise SplitFileError(f"{first.path}: this is part {no + 1} of {count} ({SPLIT_NO} {no}); "
                             f"a split model is opened by its first part{hint}")
    if match is None or int(match["no"]) != 1 or int(match["count"]) != count:
        raise SplitFileError(
            f"{first.path}: {SPLIT_COUNT} is {count}, so the file must be named "
            f"<prefix>-00001-of-{count:05d}.gguf for its other parts to be found")
    prefix = first.path.with_name(match["prefix"])

    parts = [first]
    tensors: dict[str, GGUFTensor] = dict(first.tensors)
    where: dict[str, Path] = dict.fromkeys(first.tensors, first.path)
    for index in range(1, count):
        path = part_path(prefix, index, count)
        if not path.exists():
            raise SplitFileError(f"{path}: part {index + 1} of {count} of {first.path.name} "
                                 f"is missing")
        part = open_part(path)
        for key, want in ((SPLIT_NO, index), (SPLIT_COUNT, count), (SPLIT_TENSORS_COUNT, total)):
            found = _split_int(part, key, 0, (1 << 31) - 1)
            if found != want:
                raise SplitFileError(
                    f"{path}: {key} is {found}, expected {want} (part {index + 1} of {count} "
                    f"of {first.path.name}; is it a part of another model?)")
        for name, t in part.tensors.items():
            if name in tensors:
                raise SplitFileError(f"{path}: tensor {name!r} is also in {where[name].name}; "
                                     f"each tensor of a split model lies in one part")
            tensors[name] = t
            where[name] = path
        parts.append(part)
    if len(tensors) != total:
        raise SplitFileError(f"{first.path}: {SPLIT_TENSORS_COUNT} is {total}, but the {count} "
                             f"parts hold {len(tensors)} tensors")

    metadata = {k: v for k, v in first.metadata.items() if k not in SPLIT_KEYS}
    types = {k: v for k, v in first.metadata_types.items() if k not in SPLIT_KEYS}
    return GGUFFile(first.path, first.version, first.alignment, first.data_offset,
                    sum(p.file_size for p in parts), metadata, types, tensors,
                    parts=tuple(p.path for p in parts))


def _split_int(gguf: GGUFFile, key: str, low: int, high: int) -> int:
    value = gguf.metadata.get(key)
    if value is None:
        raise SplitFileError(f"{gguf.path}: {key} is missing, so the file is not a part of a "
                             f"split model")
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise SplitFileError(f"{gguf.path}: {key} is {value!r}, expected an integer in "
                             f"{low}..{high}")
    return value
