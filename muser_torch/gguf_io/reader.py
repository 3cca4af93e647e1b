"""Reading GGUF files: a zero-copy parser and the records it returns.

Why our own parser rather than ``gguf.GGUFReader``: that reader builds its
tensor list through ``GGMLQuantizationType(raw_id)``, so a file holding the
Muser-native ids 1000/1001 (or any id newer than the installed gguf) cannot
be opened at all. Here an id without a block format is still listed, with
its raw id, and refused only when its bytes are asked for.

Every count and length is checked against the bytes left in the file before
anything is allocated, so a corrupt header fails fast with a ``GGUFError``
instead of trying to build a list of 2**60 strings. Tensor data is never
copied: ``GGUFTensor.packed`` is a torch view of a read-only memory map,
so opening a 16 GB file costs its header and pages are read as touched.
Do not write into those views: the pages are mapped read-only and a write
faults (``.clone()`` first). The layout itself is drawn in ``types``; the
records returned (``GGUFFile``, ``GGUFTensor``) live in ``records``.
"""
from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from tqdm import tqdm

from ..errors import (GGUFError, GGUFFormatError, GGUFTruncatedError, MetadataError,
                      UnsupportedVersionError)
from . import pages
from .records import GGUFFile, GGUFTensor
from .split import is_split, join
from .types import (_INT64_MAX, _INTS, _SCALARS, _U32, _U64, DEFAULT_ALIGNMENT, MAGIC,
                    MAX_ARRAY_ITEMS, MAX_DIMS, MAX_KEY_BYTES, MAX_TENSOR_NAME_BYTES, VERSIONS, V,
                    GGUFValueType, _align, block_geometry, type_name)

# Smallest encodings, used to bound counts by the bytes left in the file.
_MIN_KV_BYTES = 8 + 4 + 1           # empty key, type, one u8
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset
_MIN_STRING_BYTES = 8
_COPY_DECODE_BYTES = 1 << 16   # strings longer than this decode without a copy


# ---- reading -----------------------------------------------------------------

class _Cursor:
    """Reads header fields off the map, checking every length against the file."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise GGUFTruncatedError(
                f"file ends inside {what}: {n} bytes needed at offset {self.pos}, "
                f"only {self.size - self.pos} left (file size {self.size})")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return v

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return v

    def string(self, what: str, max_bytes: int | None = None) -> str:
        n = self.u64(f"the length of {what}")
        self.need(n, f"{what} ({n} bytes)")
        if max_bytes is not None and n > max_bytes:
            raise GGUFFormatError(f"{what} at offset {self.pos - 8} is {n} bytes long; the GGUF "
                                  f"spec allows at most {max_bytes}")
        start = self.pos
        self.pos += n
        try:
            if n <= _COPY_DECODE_BYTES:
                return self.buf[start:self.pos].decode("utf-8")
            # A long string decodes straight from the map: slicing first would
            # copy it, doubling the memory a corrupt length can cost.
            with memoryview(self.buf) as whole, whole[start:self.pos] as view:
                return str(view, "utf-8")
        except UnicodeDecodeError as e:
            raise GGUFFormatError(f"{what} at offset {start} is not valid UTF-8: {e}") from None

    def skip_strings(self, n: int, what: str) -> None:
        """Step over ``n`` strings, checking each length against the file (a
        tight loop: a vocabulary holds hundreds of thousands)."""
        buf, size, pos, unpack = self.buf, self.size, self.pos, _U64.unpack_from
        for i in range(n):
            if size - pos < 8:
                self.pos = pos
                self.need(8, f"the length of item {i} of {what}")
            (length,) = unpack(buf, pos)
            pos += 8
            if length > size - pos:
                self.pos = pos
                self.need(length, f"item {i} of {what} ({length} bytes)")
            pos += length
        self.pos = pos

    def count(self, what: str, min_item_bytes: int) -> int:
        """A u64 count, refused if the items could not fit in the rest of the file."""
        n = self.u64(what)
        left = self.size - self.pos
        if n > left // min_item_bytes:
            # Truncated or absurd, the file cannot hold them: refuse before allocating.
            raise GGUFTruncatedError(
                f"{what} is {n}, but the file ends {left} bytes later and {n} entries "
                f"need at least {n * min_item_bytes} bytes")
        return n

    def value_type(self, what: str) -> GGUFValueType:
        raw = self.u32(f"the type of {what}")
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise GGUFFormatError(f"{what} has unknown value type {raw} "
                                  f"(valid: 0..{max(GGUFValueType)})") from None

    def value(self, vtype: GGUFValueType, what: str) -> Any:
        if vtype == V.STRING:   # located now, decoded with the arrays (see ``array``)
            start = self.pos
            n = self.u64(f"the length of {what}")
            self.need(n, f"{what} ({n} bytes)")
            self.pos += n
            return _Deferred(vtype, start, 1, what, array=False)
        if vtype == V.ARRAY:
            return self.array(what)
        dt = _SCALARS[vtype]
        self.need(dt.itemsize, what)
        v = np.frombuffer(self.buf, dtype=dt, count=1, offset=self.pos)[0]
        self.pos += dt.itemsize
        return bool(v) if vtype == V.BOOL else v.item()

    def array(self, what: str) -> tuple[GGUFValueType, "_Deferred"]:
        """An array's item type and where its items lie; ``materialize`` reads
        them. Values (string values too) are read only once the whole header
        has checked out: a corrupt count or length that still fits the file
        would otherwise turn up to the file's size of bytes into Python
        objects (8 to 36 bytes an item, or a string as long as the file)
        before the garbage after it is noticed."""
        itype = self.value_type(f"the items of {what}")
        if itype == V.ARRAY:
            # llama.cpp's reader refuses nested arrays too; refusing keeps
            # every value either a scalar or a flat list.
            raise GGUFFormatError(f"{what} is an array of arrays, which GGUF readers do not support")
        if itype == V.STRING:
            n = self._items(what, _MIN_STRING_BYTES)
            start = self.pos
            self.skip_strings(n, what)
            return itype, _Deferred(itype, start, n, what)
        dt = _SCALARS[itype]
        n = self._items(what, dt.itemsize)
        start = self.pos
        self.pos += n * dt.itemsize
        return itype, _Deferred(itype, start, n, what)

    def _items(self, what: str, min_item_bytes: int) -> int:
        """An array's length: it must fit in the file, and be at most
        MAX_ARRAY_ITEMS, checked before any item is looked at."""
        n = self.count(f"the length of array {what}", min_item_bytes)
        if n > MAX_ARRAY_ITEMS:
            raise MetadataError(f"{what} is an array of {n:,} items; at most {MAX_ARRAY_ITEMS:,} "
                                f"are read (the largest published vocabularies have a few "
                                f"hundred thousand tokens)")
        return n

    def materialize(self, d: "_Deferred") -> "str | list":
        """The value located by ``value`` or ``array``: a str, or a list."""
        if d.itype == V.STRING:
            strings = self._strings(d)
            return strings if d.array else strings[0]
        items = np.frombuffer(self.buf, dtype=_SCALARS[d.itype], count=d.count, offset=d.offset)
        if d.itype == V.BOOL:
            items = items != 0
        return items.tolist()

    def _strings(self, d: "_Deferred") -> list[str]:
        # Lengths were checked when located; only the UTF-8 can be wrong now.
        buf, pos, unpack, out = self.buf, d.offset, _U64.unpack_from, []
        for i in range(d.count):
            (length,) = unpack(buf, pos)
            pos += 8
            if length <= _COPY_DECODE_BYTES:
                try:
                    out.append(buf[pos:pos + length].decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise GGUFFormatError(f"{d.item(i)} at offset {pos} is not valid UTF-8: "
                                          f"{e}") from None
            else:
                self.pos = pos - 8
                out.append(self.string(d.item(i)))
            pos += length
        return out


@dataclass(frozen=True)
class _Deferred:
    """A string value or an array located in the header, not read yet. For
    strings ``offset`` is that of the (first) length field."""
    itype: GGUFValueType
    offset: int
    count: int
    what: str
    array: bool = True

    def item(self, i: int) -> str:
        return f"item {i} of {self.what}" if self.array else self.what

    def __repr__(self) -> str:
        return f"<array of {self.count} {self.itype.name}>" if self.array else "<a string>"


def load_gguf(path: "str | os.PathLike[str]", *, progress: bool = False) -> GGUFFile:
    """Open a GGUF file (v2 or v3, any alignment, any tensor type) without
    copying its tensor data. Raises a ``GGUFError`` subclass naming what is
    wrong with a malformed file. ``progress`` shows a bar (after one second)
    while the header is parsed. The first part of a split model
    (``<prefix>-00001-of-0000N.gguf``) opens every part as one file
    (``split.join``; a ``SplitFileError`` names a missing or foreign part)."""
    first = _load_one(Path(path), progress)
    if not is_split(first):
        return first
    return join(first, lambda part: _load_one(part, progress))


def check_file(path: "str | os.PathLike[str]") -> Path:
    """``path`` when it names a file; else an OSError in one line, worded the
    same for every command (``run``, ``inspect``, ``serve``, ``from_gguf``)
    rather than the system's ``[Errno 21] Is a directory``."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory, not a GGUF file")
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    return path


def _load_one(path: Path, progress: bool) -> GGUFFile:
    check_file(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise GGUFTruncatedError(f"{path}: file is empty, expected a GGUF header")
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(path, mm, size, progress)
    except GGUFError as e:
        if str(path) not in str(e):       # every refusal names the file it is about
            e.args = (f"{path}: {e}",) + e.args[1:]
        _close_quietly(mm)
        raise
    except Exception:
        _close_quietly(mm)
        raise


def _close_quietly(mm: mmap.mmap) -> None:
    # No view of the map has escaped yet, so it can be closed now rather than
    # when the garbage collector finds it (the fuzz test opens thousands of
    # bad files).
    try:
        mm.close()
    except BufferError:
        pass


def _parse(path: Path, mm: mmap.mmap, size: int, progress: bool) -> GGUFFile:
    cur = _Cursor(mm, size)
    cur.need(4, "the magic")
    magic = mm[0:4]
    if magic != MAGIC:
        raise GGUFFormatError(f"{path}: not a GGUF file: magic is {magic!r}, expected {MAGIC!r}")
    cur.pos = 4
    version = cur.u32("the version")
    if version not in VERSIONS:
        if version & 0xFFFF == 0 and version:
            raise UnsupportedVersionError(
                f"{path}: big-endian GGUF (version reads as {version:#x}); only "
                f"little-endian files are supported")
        raise UnsupportedVersionError(
            f"{path}: GGUF version {version} is not supported (expected one of {VERSIONS})")
    n_tensors = cur.count("the tensor count", _MIN_TENSOR_INFO_BYTES)
    n_kv = cur.count("the metadata count", _MIN_KV_BYTES)

    bar = tqdm(total=n_kv + n_tensors, desc=f"reading {path.name}", unit="entry",
               delay=1.0, disable=not progress, leave=False)
    try:
        metadata: dict[str, Any] = {}
        types: dict[str, GGUFValueType] = {}
        for i in range(n_kv):
            key = cur.string(f"metadata key {i}", MAX_KEY_BYTES)
            if key in metadata:
                raise GGUFFormatError(f"metadata key {key!r} appears twice (second at entry {i})")
            vtype = cur.value_type(f"metadata {key!r}")
            value = cur.value(vtype, f"metadata {key!r}")
            if vtype == V.ARRAY:
                vtype, value = value
            metadata[key], types[key] = value, vtype
            bar.update()

        infos = []
        for i in range(n_tensors):
            name = cur.string(f"the name of tensor {i}", MAX_TENSOR_NAME_BYTES)
            n_dims = cur.u32(f"the dimension count of tensor {name!r}")
            if n_dims > MAX_DIMS:
                raise GGUFFormatError(f"tensor {name!r} has {n_dims} dimensions, at most {MAX_DIMS} allowed")
            ne = tuple(cur.u64(f"dimension {d} of tensor {name!r}") for d in range(n_dims))
            type_id = cur.u32(f"the type of tensor {name!r}")
            offset = cur.u64(f"the data offset of tensor {name!r}")
            infos.append((name, ne, type_id, offset))
            bar.update()
    finally:
        bar.close()

    alignment = _alignment(metadata, types)
    data_offset = _align(cur.pos, alignment)
    buf = np.frombuffer(mm, dtype=np.uint8)
    tensors = _check_tensors(infos, alignment, data_offset, size, buf)
    pages.register(mm, buf.ctypes.data)   # its tensors' pages may be released (pages.py)
    for key, value in metadata.items():
        if isinstance(value, _Deferred):
            metadata[key] = cur.materialize(value)
    # the header now lives in Python values (a vocabulary's arrays: 6 MB for
    # Gemma 3), so its pages leave the resident set (pages.py)
    pages.release_span(mm, 0, data_offset)
    return GGUFFile(path, version, alignment, data_offset, size, metadata, types, tensors)


def _alignment(metadata: Mapping[str, Any], types: Mapping[str, GGUFValueType]) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    a = metadata["general.alignment"]
    if types["general.alignment"] not in _INTS or not isinstance(a, int) or a <= 0 or a & (a - 1):
        raise GGUFFormatError(
            f"general.alignment is {a!r} ({types['general.alignment'].name}), "
            f"expected a positive power of two")
    return a


def _check_tensors(infos, alignment: int, data_offset: int, size: int,
                   buf: np.ndarray) -> dict[str, GGUFTensor]:
    tensors: dict[str, GGUFTensor] = {}
    for name, ne, type_id, rel in infos:
        if name in tensors:
            raise GGUFFormatError(f"tensor name {name!r} appears twice")
        if any(d == 0 or d > _INT64_MAX for d in ne) or math.prod(ne) > _INT64_MAX:
            raise GGUFFormatError(f"tensor {name!r} has an invalid shape ne={list(ne)} "
                                  f"(every dimension must be in 1..2**63-1)")
        if rel % alignment:
            raise GGUFFormatError(f"tensor {name!r}: data offset {rel} is not a multiple of "
                                  f"the alignment {alignment}")
        geometry = block_geometry(type_id)
        nbytes = None
        if geometry is not None:
            elems, block_bytes = geometry
            n_in = ne[0] if ne else 1
            if n_in % elems:
                raise GGUFFormatError(
                    f"tensor {name!r}: rows of {n_in} elements do not fill whole "
                    f"{type_name(type_id)} blocks of {elems}, so no byte size matches its "
                    f"shape ne={list(ne)}")
            nbytes = math.prod(ne) // elems * block_bytes
        start = data_offset + rel
        end = start + (nbytes or 0)
        if end > size:
            raise GGUFTruncatedError(
                f"tensor {name!r}: data [{start}, {end}) ({type_name(type_id)}, ne={list(ne)}) "
                f"runs past the end of the file ({size} bytes)")
        tensors[name] = GGUFTensor(name, type_id, ne, start, nbytes, buf)

    sized = sorted((t for t in tensors.values() if t.nbytes), key=lambda t: t.offset)
    for a, b in zip(sized, sized[1:]):
        if a.offset + a.nbytes > b.offset:
            raise GGUFFormatError(
                f"tensors {a.name!r} [{a.offset}, {a.offset + a.nbytes}) and "
                f"{b.name!r} [{b.offset}, {b.offset + b.nbytes}) overlap")
    return tensors

