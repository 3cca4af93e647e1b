"""Mutants of a real GGUF file: byte flips, truncation at structural
boundaries, random and huge integers over header fields, tensor offsets past
the end, tensor type ids swapped, and every metadata key rewritten with
hostile values.

A mutant is a recipe (``Mutant``) applied to the base file's header; the
tensor data after it is copied for a small file, and for a large one its
first 8 MB are, then a hole keeps the original length, so a 253 MB file costs
a header write (and 8 MB) per mutant. Mutant ``i`` of a file depends only on
``(seed, file name, i)``, so any one of them can be rebuilt alone.
"""
from __future__ import annotations

import math
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import tokenizer_mutants as tm
from .layout import ARRAY, SCALAR_FORMATS, STRING, TYPE_NAMES, KV, Layout

EXTREMES = (0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64 - 1)
TYPE_IDS = (0, 1, 2, 3, 8, 10, 12, 13, 14, 30, 39, 40, 1000, 1001, 4242, 2**32 - 1)
MEGA_STRING = "a" * (1 << 20)   # one shared object: mutants keep a reference, not a copy


@dataclass
class Mutant:
    index: int
    kind: str                      # flip | int | huge | past_eof | truncate | key | tensor_type |
    #                                vocab | template | combo
    detail: str                    # what was done, for the report and replay
    touches: tuple[str, ...] = ()  # metadata keys / field names it touches
    # (offset in the base file, bytes to write or None, bit mask to flip when None)
    edits: list[tuple[int, bytes | None, int]] = field(default_factory=list)
    # replace header bytes [a, b) with the entry (key, vtype, value, item_type), encoded
    # only when the file is written (None: with nothing, deleting an entry)
    splice: tuple[int, int, tuple] | None = None
    length: int | None = None      # truncate the file to this many bytes
    value: Any = None              # the value written (key sweep and int mutations)


# ---- encoding -----------------------------------------------------------------

def _s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def encode_value(vtype: int, value: Any, item_type: int | None = None) -> bytes:
    """Type tag and payload of a metadata value (``vtype`` ARRAY takes a list)."""
    if vtype == STRING:
        return struct.pack("<I", STRING) + _s(value)
    if vtype == ARRAY:
        items = b"".join(_s(v) if item_type == STRING else struct.pack(SCALAR_FORMATS[item_type], v)
                         for v in value)
        return struct.pack("<IIQ", ARRAY, item_type, len(value)) + items
    return struct.pack("<I", vtype) + struct.pack(SCALAR_FORMATS[vtype], value)


def key_variants(kv: KV) -> list[tuple[str, int, Any, int | None]]:
    """(label, vtype, value, item_type) of every hostile rewrite of ``kv``:
    the wrong type, 0, -1, u32/u64 max, +-inf, NaN, huge floats, a 1 MB
    string, an array where a scalar belongs (and a scalar, an empty array and
    the wrong item type where an array belongs)."""
    own = kv.vtype if kv.vtype in SCALAR_FORMATS else 4
    out = [
        ("zero", own, False if own == 7 else (0.0 if own in (6, 12) else 0), None),
        ("-1 INT32", 5, -1, None), ("-1 INT64", 11, -1, None),
        ("u32 max", 4, 2**32 - 1, None), ("u64 max", 10, 2**64 - 1, None),
        ("+inf FLOAT32", 6, math.inf, None), ("-inf FLOAT32", 6, -math.inf, None),
        ("NaN FLOAT32", 6, math.nan, None), ("+inf FLOAT64", 12, math.inf, None),
        ("1e308 FLOAT64", 12, 1e308, None), ("1.5 FLOAT32", 6, 1.5, None),
        ("true BOOL", 7, True, None), ("1 MB string", STRING, MEGA_STRING, None),
    ]
    if kv.vtype == STRING:
        out.append(("UINT32 where a string belongs", 4, 7, None))
    else:
        out.append(("string where a number belongs", STRING, "12", None))
    if kv.vtype == ARRAY:
        out += [("UINT32 scalar where an array belongs", 4, 1, None),
                ("empty array", ARRAY, [], kv.item_type),
                ("array of FLOAT32 where other items belong" if kv.item_type != 6 else
                 "array of STRING where numbers belong",
                 ARRAY, [0.5] * 3 if kv.item_type != 6 else ["x"] * 3,
                 6 if kv.item_type != 6 else STRING)]
    else:
        item = kv.vtype if kv.vtype in SCALAR_FORMATS else STRING
        sample = {STRING: "x", 7: True, 6: 1.0, 12: 1.0}.get(item, 1)
        out.append(("array where a scalar belongs", ARRAY, [sample, sample], item))
    return out


def _kv_mutant(index: int, lay: Layout, kv: KV, variant) -> Mutant:
    label, vtype, value, item_type = variant
    shown = f"{len(value)}-char string" if isinstance(value, str) and len(value) > 32 else value
    return Mutant(index, "key", f"metadata {kv.key} ({TYPE_NAMES[kv.vtype]}) := {label}"
                  f" [{TYPE_NAMES[vtype]} {shown!r}]", (kv.key,),
                  splice=(kv.start, kv.end, (kv.key, vtype, value, item_type)), value=value)


# ---- the deterministic sweep --------------------------------------------------------

def sweep(lay: Layout) -> list[Mutant]:
    """Every boundary truncation, every key x hostile value, in file order,
    then every tokenizer edit and every chat template (put in or replaced)."""
    out: list[Mutant] = []
    for cut in lay.boundaries():
        out.append(Mutant(len(out), "truncate", f"truncate at {cut} ({lay.field_at(cut)})",
                          (lay.field_at(cut),), length=cut))
    for kv in lay.kvs:
        for variant in key_variants(kv):
            out.append(_kv_mutant(len(out), lay, kv, variant))
    for edit in _vocab_edits(lay):
        out.append(_vocab_mutant(len(out), edit))
    for label, text in tm.template_variants():
        out.append(_template_mutant(len(out), lay, label, text))
    return out


def _vocab_edits(lay: Layout) -> list:
    cached = getattr(lay, "_vocab_edits", None)
    if cached is None:
        cached = lay._vocab_edits = tm.vocab_edits(lay)
    return cached


def _vocab_mutant(index: int, edit) -> Mutant:
    label, key, edits, splice = edit
    return Mutant(index, "vocab", f"tokenizer: {label}", (key,), edits=list(edits), splice=splice)


def _template_mutant(index: int, lay: Layout, label: str, text: str) -> Mutant:
    edits, splice = tm.set_key(lay, tm.TEMPLATE_KEY, STRING, text)
    return Mutant(index, "template", f"{tm.TEMPLATE_KEY} := {label} ({len(text)} chars)",
                  (tm.TEMPLATE_KEY,), edits=edits, splice=splice, value=text)


# ---- random mutants -------------------------------------------------------------------

def _flip(rng, lay: Layout, index: int, small: bool) -> Mutant:
    edits, where = [], []
    header = rng.random() < 0.9 or not small
    for _ in range(int(rng.integers(1, 4))):
        if header and rng.random() < 0.7:
            f = lay.fields[int(rng.integers(len(lay.fields)))]
            pos = f.offset + int(rng.integers(f.width))
        else:
            pos = int(rng.integers(lay.data_start if header else lay.file_size))
        edits.append((pos, None, 1 << int(rng.integers(8))))
        where.append(lay.field_at(pos))
    return Mutant(index, "flip", "flip bits " + ", ".join(
        f"{p}^{bit:#04x} ({w})" for (p, _, bit), w in zip(edits, where)), tuple(where), edits=edits)


def _write_int(index, f, v, kind) -> Mutant:
    v &= (1 << (8 * f.width)) - 1
    return Mutant(index, kind, f"{f.name} := {v}", (f.name,),
                  edits=[(f.offset, v.to_bytes(f.width, "little"), 0)], value=v)


def _random_int(rng, lay: Layout, index: int) -> Mutant:
    f = lay.fields[int(rng.integers(len(lay.fields)))]
    (orig,) = struct.unpack_from("<I" if f.width == 4 else "<Q", lay.head, f.offset)
    pick = int(rng.integers(4))
    if pick == 0:
        v = int.from_bytes(rng.bytes(f.width), "little")
    elif pick == 1:
        v = int(rng.integers(0, 65))
    elif pick == 2:
        v = orig + int(rng.integers(-3, 4))
    else:
        v = orig * int(rng.integers(2, 1000))
    return _write_int(index, f, v, "int")


def _huge(rng, lay: Layout, index: int) -> Mutant:
    fields = [f for f in lay.fields if f.role in ("count", "length", "dims", "ndims", "value")]
    f = fields[int(rng.integers(len(fields)))]
    return _write_int(index, f, EXTREMES[int(rng.integers(len(EXTREMES)))], "huge")


def _past_eof(rng, lay: Layout, index: int) -> Mutant:
    t = lay.tensors[int(rng.integers(len(lay.tensors)))]
    f = next(x for x in lay.fields if x.name == f"tensor[{t.index}] {t.name} data offset")
    a = lay.alignment
    data_len = -(-lay.data_len // a) * a
    v = [data_len, data_len + a * int(rng.integers(1, 4)), data_len - a, 2**63,
         2**64 - a, (data_len // 2) // a * a][int(rng.integers(6))]
    return _write_int(index, f, v, "past_eof")


def _tensor_type(rng, lay: Layout, index: int) -> Mutant:
    t = lay.tensors[int(rng.integers(len(lay.tensors)))]
    f = next(x for x in lay.fields if x.name == f"tensor[{t.index}] {t.name} type")
    return _write_int(index, f, TYPE_IDS[int(rng.integers(len(TYPE_IDS)))], "tensor_type")


def _random_key(rng, lay: Layout, index: int) -> Mutant:
    kv = lay.kvs[int(rng.integers(len(lay.kvs)))]
    variants = key_variants(kv)
    return _kv_mutant(index, lay, kv, variants[int(rng.integers(len(variants)))])


def _vocab(rng, lay: Layout, index: int) -> Mutant:
    edits = _vocab_edits(lay)
    if not edits:
        return _random_key(rng, lay, index)
    return _vocab_mutant(index, edits[int(rng.integers(len(edits)))])


def _template(rng, lay: Layout, index: int) -> Mutant:
    if rng.random() < 0.5:
        label, text = tm.corrupt_template(rng)
    else:
        variants = tm.template_variants()
        label, text = variants[int(rng.integers(len(variants)))]
    return _template_mutant(index, lay, label, text)


def _truncate(rng, lay: Layout, index: int) -> Mutant:
    cuts = lay.boundaries()
    cut = cuts[int(rng.integers(len(cuts)))] + int(rng.integers(-1, 2))
    cut = min(max(cut, 0), lay.file_size - 1)
    return Mutant(index, "truncate", f"truncate at {cut} ({lay.field_at(cut)})",
                  (lay.field_at(cut),), length=cut)


_KINDS = ((_flip, 0.20), (_random_int, 0.18), (_huge, 0.10), (_past_eof, 0.07),
          (_tensor_type, 0.07), (_random_key, 0.25), (_truncate, 0.08),
          (_vocab, 0.07), (_template, 0.08))


def random_mutant(seed: int, lay: Layout, index: int) -> Mutant:
    """Mutant ``index`` of this file for ``seed``; one in seven combines two."""
    rng = np.random.default_rng([seed, zlib.crc32(lay.path.name.encode()), index])
    small = lay.file_size < (64 << 20)

    def one() -> Mutant:
        fns, weights = zip(*_KINDS)
        fn = fns[int(rng.choice(len(fns), p=np.array(weights) / sum(weights)))]
        return fn(rng, lay, index, small) if fn is _flip else fn(rng, lay, index)

    m = one()
    if rng.random() < 1 / 7:
        second = one()
        if m.splice is None or second.splice is None:
            m = Mutant(index, "combo", f"{m.detail}; {second.detail}", m.touches + second.touches,
                       m.edits + second.edits, m.splice or second.splice,
                       _min_len(m.length, second.length), m.value)
    return m


def _min_len(a, b):
    return b if a is None else a if b is None else min(a, b)


# ---- building the file ----------------------------------------------------------------

def materialize(lay: Layout, m: Mutant, dest: Path, data: bytes) -> int:
    """Write mutant ``m`` to ``dest``; returns its size. ``data`` is the start
    of the base file's tensor data (all of it for a small file): it follows
    the header, and the rest of the original length is a hole (sparse where
    the filesystem allows, reading as zeros)."""
    header = bytearray(lay.head[:lay.data_start])
    body_edits = []
    for pos, raw, bit in m.edits:
        if pos >= lay.data_start:
            body_edits.append((pos - lay.data_start, raw, bit))
            continue
        if raw is None:
            header[pos] ^= bit
        else:
            header[pos:pos + len(raw)] = raw[:lay.data_start - pos]
    if m.splice is not None:
        a, b, entry = m.splice     # entry None: the key-value pair is deleted
        new = b"" if entry is None else _s(entry[0]) + encode_value(*entry[1:])
        infos = header[:a] + new + header[b:lay.infos_end]
        header = infos + bytes(-len(infos) % lay.alignment)   # the data keeps its alignment
    total = len(header) + lay.data_len
    if m.length is not None:
        total = min(total, m.length)
    with open(dest, "wb") as f:
        f.write(header[:total])
        rest = total - len(header)
        if rest > 0:
            body = bytearray(data[:rest])
            for pos, raw, bit in body_edits:
                if pos < len(body):
                    if raw is None:
                        body[pos] ^= bit
                    else:
                        body[pos:pos + len(raw)] = raw[:len(body) - pos]
            f.write(body)
            f.truncate(total)
    return total


REAL_DATA_BYTES = 8 << 20   # of a large file, this much real tensor data follows each header


def read_base(path: Path, lay: Layout) -> bytes:
    """The tensor data written after mutated headers: all of a small file's,
    the first ``REAL_DATA_BYTES`` of a large one's (so a parse that runs past
    the header meets real bytes, not only the hole's zeros)."""
    with open(path, "rb") as f:
        f.seek(lay.data_start)
        return f.read(REAL_DATA_BYTES if lay.data_len > 8 * REAL_DATA_BYTES else -1)
