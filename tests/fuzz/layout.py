"""Where every header field of a GGUF file sits, found by a scanner of its
own (independent of ``muser_torch.gguf_io``, whose refusals are under test).

The mutators need byte positions: a field to overwrite, a boundary to cut at,
a key-value entry to replace. The scanner trusts its input, so it runs only
on the unmutated base files.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

# GGUF value types (GGUF spec): fixed-width scalars, STRING = 8, ARRAY = 9
SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i",
                  6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
TYPE_NAMES = {0: "UINT8", 1: "INT8", 2: "UINT16", 3: "INT16", 4: "UINT32", 5: "INT32",
              6: "FLOAT32", 7: "BOOL", 8: "STRING", 9: "ARRAY", 10: "UINT64", 11: "INT64",
              12: "FLOAT64"}
DEFAULT_ALIGNMENT = 32


@dataclass(frozen=True)
class Field:
    """One fixed-width integer of the header: ``name`` says what it is
    (e.g. ``kv[3] glimmer.block_count value``), ``width`` is 4 or 8 bytes,
    ``role`` groups fields the mutators treat alike."""
    name: str
    offset: int
    width: int
    role: str        # count | length | type | dims | ndims | offset | value | version | magic


@dataclass(frozen=True)
class KV:
    index: int
    key: str
    vtype: int               # the value type; ARRAY for arrays
    item_type: int | None    # arrays only
    start: int               # first byte of the key's length
    value_start: int         # first byte after the value type
    end: int                 # one past the value


@dataclass(frozen=True)
class TensorInfo:
    index: int
    name: str
    type_id: int
    ne: tuple[int, ...]
    start: int
    end: int
    rel_offset: int          # data offset relative to the data start


@dataclass
class Layout:
    path: Path
    file_size: int
    alignment: int
    kvs: list[KV] = field(default_factory=list)
    tensors: list[TensorInfo] = field(default_factory=list)
    fields: list[Field] = field(default_factory=list)
    infos_end: int = 0       # one past the last tensor info
    data_start: int = 0      # infos_end rounded up to the alignment
    head: bytes = b""        # the file's bytes up to data_start

    @property
    def data_len(self) -> int:
        return self.file_size - self.data_start

    def boundaries(self) -> list[int]:
        """Every structural boundary: each field and entry start, the end of
        the infos, the data start, and each tensor's first data byte."""
        cuts = {0, 4, 8, 16, 24, self.infos_end, self.data_start, self.file_size - 1}
        for f in self.fields:
            cuts.add(f.offset)
        for kv in self.kvs:
            cuts.update((kv.start, kv.value_start, kv.end))
        for t in self.tensors:
            cuts.update((t.start, t.end, self.data_start + t.rel_offset))
        return sorted(c for c in cuts if 0 <= c < self.file_size)

    def field_at(self, pos: int) -> str:
        """The name of the header part byte ``pos`` belongs to."""
        for f in self.fields:
            if f.offset <= pos < f.offset + f.width:
                return f.name
        for kv in self.kvs:
            if kv.start <= pos < kv.end:
                return f"kv[{kv.index}] {kv.key} bytes"
        for t in self.tensors:
            if t.start <= pos < t.end:
                return f"tensor[{t.index}] {t.name} bytes"
        if pos < self.data_start:
            return "padding"
        return "tensor data"


class _Scan:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str):
        (v,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def string(self) -> str:
        n = self.take("<Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s


def scan(path: str | Path) -> Layout:
    """The layout of a well-formed GGUF file (v2/v3, little-endian)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(min(size, 64 << 20))     # headers of real files are a few MB
    sc = _Scan(head)
    assert head[:4] == b"GGUF", f"{path} is not a GGUF file"
    lay = Layout(path, size, DEFAULT_ALIGNMENT)
    sc.pos = 4

    def take(name: str, fmt: str, role: str):
        """Read one fixed-width value, recording it as a field when it is 4 or 8 bytes."""
        if struct.calcsize(fmt) in (4, 8):
            lay.fields.append(Field(name, sc.pos, struct.calcsize(fmt), role))
        return sc.take(fmt)

    def string(name: str) -> str:
        lay.fields.append(Field(f"{name} length", sc.pos, 8, "length"))
        return sc.string()

    take("version", "<I", "version")
    n_tensors, n_kv = take("tensor_count", "<Q", "count"), take("kv_count", "<Q", "count")
    for i in range(n_kv):
        start = sc.pos
        key = string(f"kv[{i}] key")
        vtype = take(f"kv[{i}] {key} type", "<I", "type")
        value_start, item_type = sc.pos, None
        if vtype == STRING:
            string(f"kv[{i}] {key} string")
        elif vtype == ARRAY:
            item_type = take(f"kv[{i}] {key} item type", "<I", "type")
            n = take(f"kv[{i}] {key} array length", "<Q", "count")
            if item_type != STRING:
                sc.pos += n * struct.calcsize(SCALAR_FORMATS[item_type])
            for j in range(n if item_type == STRING else 0):
                # the first items' lengths are fields; a 262k-token vocabulary needs no more
                string(f"kv[{i}] {key} item {j}") if j < 2 else sc.string()
        else:
            value = take(f"kv[{i}] {key} value", SCALAR_FORMATS[vtype], "value")
            if key == "general.alignment":
                lay.alignment = int(value)
        lay.kvs.append(KV(i, key, vtype, item_type, start, value_start, sc.pos))
    for i in range(n_tensors):
        start = sc.pos
        name = string(f"tensor[{i}] name")
        n_dims = take(f"tensor[{i}] {name} n_dims", "<I", "ndims")
        ne = tuple(take(f"tensor[{i}] {name} ne[{d}]", "<Q", "dims") for d in range(n_dims))
        type_id = take(f"tensor[{i}] {name} type", "<I", "type")
        rel = take(f"tensor[{i}] {name} data offset", "<Q", "offset")
        lay.tensors.append(TensorInfo(i, name, type_id, ne, start, sc.pos, rel))
    lay.infos_end = sc.pos
    lay.data_start = -(-sc.pos // lay.alignment) * lay.alignment
    lay.head = head[:lay.data_start]
    return lay
