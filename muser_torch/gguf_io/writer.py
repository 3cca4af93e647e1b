"""Writing GGUF v3 files (``save_gguf``): header packing with inferred or
given value types, tensor specs validated against their block geometry, and
an atomic write that leaves holes for all-zero tensors."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType, GGUFValueType
from tqdm import tqdm

from ..formats import GGMLType
from ..formats.floats import TORCH_DTYPES
from .records import GGUFTensor
from .types import (_INTS, _SCALARS, _U32, _U64, DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS,
                    MAX_NAME_BYTES, WRITE_VERSION, V, _align, _ggml_type, block_geometry,
                    type_name)

_PROGRESS_BYTES = 256 << 20   # save_gguf shows a bar from this many data bytes on
_WRITE_CHUNK = 64 << 20

# (qtype, data) or (qtype, data, ne); see save_gguf.
TensorSpec = Union[GGUFTensor, tuple]


def save_gguf(path: "str | os.PathLike[str]", metadata: Mapping[str, Any],
              tensors: Mapping[str, TensorSpec], *,
              types: Mapping[str, GGUFValueType] | None = None,
              progress: bool | None = None) -> None:
    """Write a GGUF v3 file.

    ``tensors`` maps names to either a ``GGUFTensor`` (its bytes are copied,
    e.g. from another file) or a tuple ``(qtype, data)`` / ``(qtype, data, ne)``:
    ``qtype`` is a GGMLType, a name or any type id with a known block size
    (Muser-native 1000/1001 and gguf's types included); ``data`` is

    - uint8 ``[n_out, row_bytes]`` (torch or numpy): the packed rows; ``ne``
      defaults to ``(n_in, n_out)``;
    - for F32/F16/BF16/F8_E4M3FN, a torch tensor of that dtype: ``ne``
      defaults to its shape reversed;
    - any bytes-like object or uint8 array holding exactly the tensor's bytes
      (``ne`` required);
    - ``None``: the tensor is all zero bytes, left as a hole so the file is
      sparse where the filesystem allows (``ne`` required);
    - a callable returning one of the above but ``None`` (``ne`` required):
      called only when the tensor's turn to be written comes, so a writer
      of a large model holds one tensor's bytes at a time.

    Metadata value types are inferred (bool; int as UINT32 when it fits,
    else INT64 or UINT64; float as FLOAT32; str; lists of one of these) unless
    ``types`` names the type (for a list, its item type). ``general.alignment``
    (default 32) sets the data alignment. ``progress`` shows a bar; by default
    only for files of 256 MiB or more.

    The file is written to ``<path>.partial`` beside ``path`` and renamed into
    place only once complete, so ``path`` holds either nothing (or the file
    that was there) or the whole new file. Any exception (a full disk,
    Ctrl-C's KeyboardInterrupt) removes the ``.partial``. A SIGKILL or a power
    loss cannot run that cleanup; the stray then keeps the one recognisable
    name ``<path>.partial`` (never a ``.gguf`` name, so it cannot be mistaken
    for output; its data ends early, which the reader refuses as truncated),
    and the next write to ``path`` truncates and reuses it.
    """
    path = Path(path)
    types = dict(types or {})
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(alignment, bool) or not isinstance(alignment, int) or alignment <= 0 \
            or alignment & (alignment - 1):
        raise ValueError(f"general.alignment must be a positive power of two, got {alignment!r}")
    if "general.alignment" in metadata:
        types.setdefault("general.alignment", V.UINT32)

    header = bytearray()
    header += MAGIC + _U32.pack(WRITE_VERSION) + _U64.pack(len(tensors)) + _U64.pack(len(metadata))
    for key, value in metadata.items():
        if not isinstance(key, str):
            raise ValueError(f"metadata key {key!r} must be a str")
        header += _pack_str(key) + _pack_value(key, value, types.get(key))

    entries = [_tensor_entry(name, spec) for name, spec in tensors.items()]
    offset = 0
    for name, type_id, ne, nbytes, _ in entries:
        header += _pack_str(name) + _U32.pack(len(ne)) + b"".join(_U64.pack(d) for d in ne)
        header += _U32.pack(type_id) + _U64.pack(offset)
        offset = _align(offset + nbytes, alignment)
    header += bytes(_align(len(header), alignment) - len(header))
    data_bytes = sum(e[3] for e in entries)

    show = data_bytes >= _PROGRESS_BYTES if progress is None else progress
    tmp = partial_path(path)
    try:
        with open(tmp, "wb") as f, tqdm(total=data_bytes, desc=f"writing {path.name}", unit="B",
                                         unit_scale=True, disable=not show, leave=False) as bar:
            f.write(header)
            pos = 0
            for i, (name, type_id, ne, nbytes, data) in enumerate(entries):
                pad = _align(pos, alignment) - pos
                if pad:
                    f.write(bytes(pad))
                if callable(data):
                    bar.set_postfix_str(f"tensor {i + 1}/{len(entries)}", refresh=False)
                    data = _produced(name, type_id, ne, nbytes, data)
                if data is None:
                    f.seek(nbytes, os.SEEK_CUR)
                    bar.update(nbytes)
                else:
                    view = memoryview(data)
                    for s in range(0, nbytes, _WRITE_CHUNK):
                        f.write(view[s:s + _WRITE_CHUNK])
                        bar.update(min(_WRITE_CHUNK, nbytes - s))
                pos = _align(pos, alignment) + nbytes
                del data
            # ggml's reader reads every tensor's padded size, the last one's too
            # (gguf-py writes that padding): pad the end, and materialize a trailing hole
            f.truncate(len(header) + _align(pos, alignment))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def partial_path(path: Path) -> Path:
    """Where ``save_gguf`` writes ``path`` before renaming it into place."""
    return path.with_name(path.name + ".partial")


def _pack_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return _U64.pack(len(b)) + b


def _infer_type(key: str, values: Sequence[Any]) -> GGUFValueType:
    if all(isinstance(v, bool) for v in values):
        return V.BOOL
    if all(isinstance(v, str) for v in values):
        return V.STRING
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        lo, hi = min(values), max(values)
        if lo >= 0 and hi < 2**32:
            return V.UINT32
        if lo >= -2**63 and hi < 2**63:
            return V.INT64
        if lo >= 0 and hi < 2**64:
            return V.UINT64
        raise ValueError(f"metadata {key!r}: integer {lo if lo < -2**63 else hi} does not fit 64 bits")
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return V.FLOAT32
    kinds = sorted({type(v).__name__ for v in values})
    raise ValueError(f"metadata {key!r}: cannot infer a GGUF type for values of type(s) "
                     f"{', '.join(kinds)}; use str, bool, int, float or a list of one of them")


def _pack_items(key: str, vtype: GGUFValueType, values: Sequence[Any]) -> bytes:
    if vtype == V.STRING:
        if not all(isinstance(v, str) for v in values):
            raise ValueError(f"metadata {key!r}: type STRING needs str values")
        return b"".join(_pack_str(v) for v in values)
    if vtype not in _SCALARS:
        raise ValueError(f"metadata {key!r}: {vtype.name} is not a valid item type")
    dt = _SCALARS[vtype]
    if vtype in _INTS or vtype == V.BOOL:
        if not all(isinstance(v, (int, np.integer)) for v in values):
            raise ValueError(f"metadata {key!r}: type {vtype.name} needs integer values")
        if vtype in _INTS and values:
            info = np.iinfo(dt)
            lo, hi = min(values), max(values)
            if lo < info.min or hi > info.max:
                raise ValueError(f"metadata {key!r}: value out of range for {vtype.name} "
                                 f"[{info.min}, {info.max}]")
    elif not all(isinstance(v, (int, float, np.integer, np.floating)) for v in values):
        raise ValueError(f"metadata {key!r}: type {vtype.name} needs numeric values")
    return np.asarray(values, dtype=dt).tobytes()


def _pack_value(key: str, value: Any, vtype: GGUFValueType | None) -> bytes:
    if isinstance(value, np.ndarray):
        value = value.tolist()
    elif isinstance(value, np.generic):
        value = value.item()
    if vtype is not None:
        vtype = GGUFValueType(vtype)
        if vtype == V.ARRAY:
            raise ValueError(f"metadata {key!r}: give the item type of an array, not ARRAY")
    if isinstance(value, (list, tuple)):
        if vtype is None:
            if not value:
                raise ValueError(f"metadata {key!r}: an empty list needs its item type in types=")
            vtype = _infer_type(key, value)
        return (_U32.pack(V.ARRAY) + _U32.pack(vtype) + _U64.pack(len(value))
                + _pack_items(key, vtype, value))
    if vtype is None:
        vtype = _infer_type(key, [value])
    return _U32.pack(vtype) + _pack_items(key, vtype, [value])


def _as_bytes(name: str, data: Any) -> np.ndarray:
    """A contiguous uint8 numpy view (or copy, for non-contiguous input) of ``data``."""
    if isinstance(data, torch.Tensor):
        t = data.detach().cpu().contiguous()
        if t.dtype != torch.uint8:
            t = t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)
        return t.numpy().reshape(-1)
    if isinstance(data, np.ndarray):
        return np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    try:
        return np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
    except TypeError:
        raise ValueError(f"tensor {name!r}: data must be a torch.Tensor, numpy array, "
                         f"bytes-like or None, got {type(data).__name__}") from None


def _tensor_entry(name: str, spec: TensorSpec):
    """(name, type_id, ne, nbytes, uint8 data or None), validated."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"tensor name {name!r} must be a non-empty str")
    if len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise ValueError(f"tensor name {name!r} is longer than {MAX_NAME_BYTES} bytes "
                         f"(llama.cpp's limit)")
    if isinstance(spec, GGUFTensor):
        return name, spec.type_id, spec.ne, spec.raw.numel(), spec.raw.numpy()
    if not isinstance(spec, tuple) or len(spec) not in (2, 3):
        raise ValueError(f"tensor {name!r}: expected a GGUFTensor or (qtype, data[, ne]), "
                         f"got {type(spec).__name__}")
    qtype, data, ne = (*spec, None) if len(spec) == 2 else spec
    type_id = _type_id(name, qtype)
    elems, block_bytes = block_geometry(type_id)
    if ne is None:
        ne = _default_ne(name, type_id, data)
    ne = tuple(int(d) for d in ne)
    if len(ne) > MAX_DIMS or any(d <= 0 for d in ne):
        raise ValueError(f"tensor {name!r}: ne={list(ne)} must have at most {MAX_DIMS} "
                         f"positive dimensions")
    if (ne[0] if ne else 1) % elems:
        raise ValueError(f"tensor {name!r}: ne[0]={ne[0] if ne else 1} is not a multiple of the "
                         f"{type_name(type_id)} block size {elems}")
    nbytes = math.prod(ne) // elems * block_bytes
    if data is None or callable(data):
        return name, type_id, ne, nbytes, data
    raw = _as_bytes(name, data)
    if raw.size != nbytes:
        raise ValueError(f"tensor {name!r}: {type_name(type_id)} with ne={list(ne)} is "
                         f"{nbytes} bytes, data has {raw.size}")
    return name, type_id, ne, nbytes, raw


def _produced(name: str, type_id: int, ne: tuple[int, ...], nbytes: int, producer: Any) -> np.ndarray:
    """The bytes a lazy tensor's producer returns, checked against its header entry."""
    raw = _as_bytes(name, producer())
    if raw.size != nbytes:
        raise ValueError(f"tensor {name!r}: {type_name(type_id)} with ne={list(ne)} is "
                         f"{nbytes} bytes, its producer gave {raw.size}")
    return raw


def _type_id(name: str, qtype: Any) -> int:
    if isinstance(qtype, str):
        try:
            return int(GGMLType[qtype.upper()])
        except KeyError:
            try:
                return int(GGMLQuantizationType[qtype.upper()])
            except KeyError:
                raise ValueError(f"tensor {name!r}: unknown type name {qtype!r}") from None
    if isinstance(qtype, bool) or not isinstance(qtype, int):
        raise ValueError(f"tensor {name!r}: type must be a GGMLType, name or int id, got {qtype!r}")
    if block_geometry(int(qtype)) is None:
        raise ValueError(f"tensor {name!r}: type id {int(qtype)} has no known block size")
    return int(qtype)


def _default_ne(name: str, type_id: int, data: Any) -> tuple[int, ...]:
    qtype = _ggml_type(type_id)
    if isinstance(data, torch.Tensor) and qtype in TORCH_DTYPES and data.dtype == TORCH_DTYPES[qtype]:
        return tuple(reversed(data.shape)) or (1,)
    is_u8 = ((isinstance(data, torch.Tensor) and data.dtype == torch.uint8)
             or (isinstance(data, np.ndarray) and data.dtype == np.uint8))
    shape = getattr(data, "shape", None)
    if not is_u8 or len(shape) != 2:
        raise ValueError(f"tensor {name!r}: without ne, data must be uint8 [n_out, row_bytes]"
                         + (f" or a {TORCH_DTYPES[qtype]} tensor" if qtype in TORCH_DTYPES else ""))
    elems, block_bytes = block_geometry(type_id)
    n_out, row_bytes = int(shape[0]), int(shape[1])
    if row_bytes == 0 or row_bytes % block_bytes:
        raise ValueError(f"tensor {name!r}: rows of {row_bytes} bytes are not whole "
                         f"{type_name(type_id)} blocks of {block_bytes} bytes")
    return row_bytes // block_bytes * elems, n_out
