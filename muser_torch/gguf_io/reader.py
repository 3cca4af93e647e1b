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
faults (``.clone()`` first). The layout itself is drawn in ``types``.
"""
from __future__ import annotations

import math
import mmap
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch
from tqdm import tqdm

from ..errors import (CompanionError, GGUFError, GGUFFormatError, GGUFTruncatedError,
                      UnsupportedTypeError, UnsupportedVersionError)
from ..formats import GGMLType
from ..formats.types import NEEDS_COMPANIONS, NVFP4_GROUP
from .types import (_INT64_MAX, _INTS, _SCALARS, _U32, _U64, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS,
                    MAX_KEY_BYTES, MAX_TENSOR_NAME_BYTES, SCALE2_SUFFIX, SCALE_SUFFIX, VERSIONS, V,
                    GGUFValueType, _align, _ggml_type, block_geometry, type_name)

# Smallest encodings, used to bound counts by the bytes left in the file.
_MIN_KV_BYTES = 8 + 4 + 1           # empty key, type, one u8
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dim, type, offset
_MIN_STRING_BYTES = 8
_COPY_DECODE_BYTES = 1 << 16   # strings longer than this decode without a copy


# ---- records ---------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor of a GGUF file. ``ne`` is GGUF's order: ``ne[0]`` is the
    row length (``n_in``); ``n_out`` is the product of the other dimensions
    (1 for a 1-D tensor). ``offset`` is the absolute byte offset in the file;
    ``nbytes`` is None only for a type id whose block geometry is unknown."""

    name: str
    type_id: int
    ne: tuple[int, ...]
    offset: int
    nbytes: int | None
    _buf: np.ndarray | None = field(default=None, repr=False)   # whole-file uint8 view

    @property
    def qtype(self) -> GGMLType | None:
        """The GGMLType, or None for an id this package cannot compute."""
        return _ggml_type(self.type_id)

    @property
    def type_name(self) -> str:
        return type_name(self.type_id)

    @property
    def n_in(self) -> int:
        return self.ne[0] if self.ne else 1

    @property
    def n_out(self) -> int:
        return math.prod(self.ne[1:])

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_out, n_in)``: the matrix view of the tensor."""
        return self.n_out, self.n_in

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def raw(self) -> torch.Tensor:
        """The tensor's bytes, uint8 ``[nbytes]``, viewing the file's memory map.
        Works for every type of known size, computable or not."""
        if self.nbytes is None:
            raise UnsupportedTypeError(
                f"tensor {self.name!r}: type id {self.type_id} has no known block size, "
                f"so its bytes cannot be located")
        if self._buf is None:
            raise UnsupportedTypeError(f"tensor {self.name!r} is not backed by a file")
        view = self._buf[self.offset:self.offset + self.nbytes]
        with warnings.catch_warnings():
            # The map is read-only on purpose (zero copy, shared page cache);
            # torch warns because it has no read-only tensors.
            warnings.filterwarnings("ignore", message=".*not writ", category=UserWarning)
            return torch.from_numpy(view)

    @property
    def packed(self) -> torch.Tensor:
        """uint8 ``[n_out, row_bytes]``: the rows as the block formats expect them."""
        qtype = self.require_qtype()
        return self.raw.view(self.n_out, qtype.row_bytes(self.n_in))

    def require_qtype(self) -> GGMLType:
        qtype = self.qtype
        if qtype is None:
            raise UnsupportedTypeError(
                f"tensor {self.name!r} has type {self.type_name} (id {self.type_id}), "
                f"which muser-torch cannot compute; supported: "
                f"{', '.join(t.name for t in GGMLType)}")
        return qtype


class GGUFFile:
    """A parsed GGUF file. ``metadata`` maps keys to Python values (lists for
    arrays); ``metadata_types`` gives each key's GGUF value type (the item
    type for arrays), so ``save_gguf(p, f.metadata, f.tensors,
    types=f.metadata_types)`` writes the same header back."""

    def __init__(self, path: Path, version: int, alignment: int, data_offset: int,
                 file_size: int, metadata: dict[str, Any],
                 metadata_types: dict[str, GGUFValueType],
                 tensors: dict[str, GGUFTensor]) -> None:
        self.path = path
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = file_size
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")

    def __getitem__(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path.name}: no tensor named {name!r}") from None

    def companions(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The NVFP4_E2M1 companions of tensor ``name`` (``X.weight``):
        ``X.weight_scale`` as float8_e4m3fn ``[n_out, n_in/16]`` and
        ``X.weight_scale_2`` as a float32 scalar. Raises CompanionError."""
        t = self[name]
        scale_name, scale2_name = name + SCALE_SUFFIX, name + SCALE2_SUFFIX
        sc = self.tensors.get(scale_name)
        s2 = self.tensors.get(scale2_name)
        if sc is None or s2 is None:
            missing = [n for n, x in ((scale_name, sc), (scale2_name, s2)) if x is None]
            raise CompanionError(
                f"tensor {name!r} is NVFP4_E2M1 but its companion(s) {', '.join(missing)} "
                f"are missing; expected {scale_name} (F8_E4M3FN) and {scale2_name} (F32)")
        want = (t.n_out, t.n_in // NVFP4_GROUP)
        if sc.type_id != GGMLType.F8_E4M3FN or sc.shape != (want[0], want[1]):
            raise CompanionError(
                f"companion {scale_name!r}: found {sc.type_name} with (n_out, n_in) "
                f"{sc.shape}, expected F8_E4M3FN {want} (one scale per {NVFP4_GROUP} "
                f"inputs of {name!r})")
        if s2.type_id != GGMLType.F32 or s2.n_elements != 1:
            raise CompanionError(
                f"companion {scale2_name!r}: found {s2.type_name} with {s2.n_elements} "
                f"elements (ne {list(s2.ne)}), expected one F32 value")
        scales = sc.packed.view(torch.float8_e4m3fn)
        scale_2 = s2.raw.view(torch.float32).reshape(())
        return scales, scale_2

    def dequantize(self, name: str, rows: "slice | Sequence[int] | torch.Tensor | None" = None
                   ) -> torch.Tensor:
        """float32 ``[n_out, n_in]`` values of tensor ``name`` (or of the selected
        ``rows``), NVFP4_E2M1 companions included. Only the rows asked for are read."""
        t = self[name]
        qtype = t.require_qtype()
        packed = t.packed
        scales = scale_2 = None
        if qtype in NEEDS_COMPANIONS:
            scales, scale_2 = self.companions(name)
        if rows is not None:
            index = rows if isinstance(rows, slice) else torch.as_tensor(rows, dtype=torch.long)
            packed = packed[index].contiguous()
            if scales is not None:
                scales = scales[index].contiguous()
        # Imported here, not at the top: the kernel-picking dequantize is moving
        # out of formats (issue 12), and the package's top level is where it stays
        # public. By call time muser_torch is fully imported, so no import circle.
        from .. import dequantize
        return dequantize(packed, qtype, t.n_in, scales=scales, scale_2=scale_2)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of all tensors of known size."""
        return sum(t.nbytes for t in self.tensors.values() if t.nbytes is not None)


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
        if vtype == V.STRING:
            return self.string(what)
        if vtype == V.ARRAY:
            return self.array(what)
        dt = _SCALARS[vtype]
        self.need(dt.itemsize, what)
        v = np.frombuffer(self.buf, dtype=dt, count=1, offset=self.pos)[0]
        self.pos += dt.itemsize
        return bool(v) if vtype == V.BOOL else v.item()

    def array(self, what: str) -> tuple[GGUFValueType, "_Deferred"]:
        """An array's item type and where its items lie; ``items`` reads them.
        They are read only once the whole header has checked out: a corrupt
        count that still fits the file would otherwise turn up to the file's
        size of bytes into Python objects (8 to 36 bytes each) before the
        garbage after it is noticed."""
        itype = self.value_type(f"the items of {what}")
        if itype == V.ARRAY:
            # llama.cpp's reader refuses nested arrays too; refusing keeps
            # every value either a scalar or a flat list.
            raise GGUFFormatError(f"{what} is an array of arrays, which GGUF readers do not support")
        if itype == V.STRING:
            n = self.count(f"the length of array {what}", _MIN_STRING_BYTES)
            start = self.pos
            self.skip_strings(n, what)
            return itype, _Deferred(itype, start, n, what)
        dt = _SCALARS[itype]
        n = self.count(f"the length of array {what}", dt.itemsize)
        start = self.pos
        self.pos += n * dt.itemsize
        return itype, _Deferred(itype, start, n, what)

    def items(self, arr: "_Deferred") -> list:
        """The items of an array found by ``array``, as a list."""
        if arr.itype == V.STRING:
            return self._strings(arr)
        items = np.frombuffer(self.buf, dtype=_SCALARS[arr.itype], count=arr.count, offset=arr.offset)
        if arr.itype == V.BOOL:
            items = items != 0
        return items.tolist()


    def _strings(self, arr: "_Deferred") -> list[str]:
        # Lengths were checked by skip_strings; only the UTF-8 can be wrong now.
        buf, pos, unpack, out = self.buf, arr.offset, _U64.unpack_from, []
        for i in range(arr.count):
            (length,) = unpack(buf, pos)
            pos += 8
            if length <= _COPY_DECODE_BYTES:
                raw = buf[pos:pos + length]
                try:
                    out.append(raw.decode("utf-8"))
                except UnicodeDecodeError as e:
                    raise GGUFFormatError(f"item {i} of {arr.what} at offset {pos} is not "
                                          f"valid UTF-8: {e}") from None
            else:
                self.pos = pos - 8
                out.append(self.string(f"item {i} of {arr.what}"))
            pos += length
        return out


@dataclass(frozen=True)
class _Deferred:
    """An array located in the header whose items are not read yet."""
    itype: GGUFValueType
    offset: int
    count: int
    what: str

    def __repr__(self) -> str:
        return f"<array of {self.count} {self.itype.name}>"


def load_gguf(path: "str | os.PathLike[str]", *, progress: bool = False) -> GGUFFile:
    """Open a GGUF file (v2 or v3, any alignment, any tensor type) without
    copying its tensor data. Raises a ``GGUFError`` subclass naming what is
    wrong with a malformed file. ``progress`` shows a bar (after one second)
    while the header is parsed."""
    path = Path(path)
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
    for key, value in metadata.items():
        if isinstance(value, _Deferred):
            metadata[key] = cur.items(value)
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

