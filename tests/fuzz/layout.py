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
    sweep_cache: list | None = field(default=None, repr=False)

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
    add = lay.fields.append
    add(Field("version", 4, 4, "version"))
    add(Field("tensor_count", 8, 8, "count"))
    add(Field("kv_count", 16, 8, "count"))
    sc.pos = 8
    n_tensors, n_kv = sc.take("<Q"), sc.take("<Q")
    for i in range(n_kv):
        start = sc.pos
        add(Field(f"kv[{i}] key length", sc.pos, 8, "length"))
        key = sc.string()
        add(Field(f"kv[{i}] {key} type", sc.pos, 4, "type"))
        vtype = sc.take("<I")
        value_start = sc.pos
        item_type = None
        if vtype == STRING:
            add(Field(f"kv[{i}] {key} string length", sc.pos, 8, "length"))
            sc.string()
        elif vtype == ARRAY:
            add(Field(f"kv[{i}] {key} item type", sc.pos, 4, "type"))
            item_type = sc.take("<I")
            add(Field(f"kv[{i}] {key} array length", sc.pos, 8, "count"))
            n = sc.take("<Q")
            if item_type == STRING:
                for j in range(n):
                    if j < 2:   # the first few items' lengths; a 262k-token vocab needs no more
                        add(Field(f"kv[{i}] {key} item {j} length", sc.pos, 8, "length"))
                    sc.string()
            else:
                sc.pos += n * struct.calcsize(SCALAR_FORMATS[item_type])
        else:
            fmt = SCALAR_FORMATS[vtype]
            if struct.calcsize(fmt) in (4, 8):
                add(Field(f"kv[{i}] {key} value", sc.pos, struct.calcsize(fmt), "value"))
            value = sc.take(fmt)
            if key == "general.alignment":
                lay.alignment = int(value)
        lay.kvs.append(KV(i, key, vtype, item_type, start, value_start, sc.pos))
    for i in range(n_tensors):
        start = sc.pos
        add(Field(f"tensor[{i}] name length", sc.pos, 8, "length"))
        name = sc.string()
        add(Field(f"tensor[{i}] {name} n_dims", sc.pos, 4, "ndims"))
        n_dims = sc.take("<I")
        ne = []
        for d in range(n_dims):
            add(Field(f"tensor[{i}] {name} ne[{d}]", sc.pos, 8, "dims"))
            ne.append(sc.take("<Q"))
        add(Field(f"tensor[{i}] {name} type", sc.pos, 4, "type"))
        type_id = sc.take("<I")
        add(Field(f"tensor[{i}] {name} data offset", sc.pos, 8, "offset"))
        rel = sc.take("<Q")
        lay.tensors.append(TensorInfo(i, name, type_id, tuple(ne), start, sc.pos, rel))
    lay.infos_end = sc.pos
    lay.data_start = -(-sc.pos // lay.alignment) * lay.alignment
    lay.head = head[:lay.data_start]
    return lay
