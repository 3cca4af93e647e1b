"""``muser-torch inspect FILE [FILE ...] [--json]``: what GGUF files hold and what they cost.

One row per tensor class, as in docs/muse-glimmer.md's benchmark shapes: the label is the
tensor name without its ``blk.N.`` prefix, and tensors are grouped by
(label, dtype, shape). Then the totals: parameters, tensor bytes, bits per
weight, bytes read per decoded token, and the lane. Works on any GGUF, not
only Glimmer; nothing is read beyond the header.

Bytes per decoded token: every tensor one token reads, once: all layer
weights and norms, the lm_head in full, and of the token embedding one row,
or all of it when the lm_head is the embedding (a tied head: the file has no
``output.weight`` and its architecture's table ties the lm_head to the
embedding, as Gemma 3's and the Llama family's do; for an architecture
muser-torch does not run, llama.cpp's convention that a missing
``output.weight`` means a tied head).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from typing import Any

from .arch import ARCHITECTURES
from .config import LANE_KEY
from .gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX, GGUFFile, load_gguf

__all__ = ["TensorClass", "Summary", "summarize", "register", "main"]

_LAYER_PREFIX = re.compile(r"^blk\.\d+\.")
EMBEDDING = "token_embd.weight"
OUTPUT = "output.weight"


@dataclass
class TensorClass:
    label: str
    dtype: str
    ne: list[int]
    count: int
    params: int
    bytes: int | None      # None when the type's block size is unknown

    @property
    def shape(self) -> str:
        """``n_in→n_out`` for a matrix (docs/muse-glimmer.md's notation), else the dims."""
        if len(self.ne) == 2:
            return f"{self.ne[0]}→{self.ne[1]}"
        return "×".join(map(str, self.ne)) or "scalar"


@dataclass
class Summary:
    file: str
    file_bytes: int
    version: int
    architecture: str | None
    lane: str | None
    tensors: int
    classes: list[TensorClass]
    parameters: int
    tensor_bytes: int
    bits_per_weight: float | None
    bytes_per_token: int
    unsized_tensors: int   # tensors whose type has no known block size: left out of bytes


def _is_companion(name: str, gguf: GGUFFile) -> bool:
    """An NVFP4 scale tensor bound to a payload: its bytes are part of that
    weight (NVFP4 is 4.5 bits/weight with them), its elements are not weights."""
    return any(name.endswith(suffix) and name[:-len(suffix)] in gguf.tensors
               for suffix in (SCALE2_SUFFIX, SCALE_SUFFIX))


def _tied_head(gguf: GGUFFile, arch: Any) -> bool:
    """Whether the lm_head is the token embedding (see the module docstring)."""
    spec = ARCHITECTURES.get(arch) if isinstance(arch, str) else None
    if spec is None:
        return OUTPUT not in gguf.tensors
    return any(row.tied_to is not None and row.name not in gguf.tensors for row in spec.tensors
               if not row.per_layer and row.name == OUTPUT)


def summarize(gguf: GGUFFile) -> Summary:
    """The tensor-class table and totals of a parsed file. Parameters count
    every tensor element (norms too) except NVFP4 companion scales."""
    classes: dict[tuple, TensorClass] = {}
    for t in gguf.tensors.values():
        label = _LAYER_PREFIX.sub("", t.name)
        key = (label, t.type_id, t.ne)
        c = classes.get(key)
        if c is None:
            c = classes[key] = TensorClass(label, t.type_name, list(t.ne), 0, 0, 0)
        c.count += 1
        c.params += 0 if _is_companion(t.name, gguf) else t.n_elements
        c.bytes = None if (c.bytes is None or t.nbytes is None) else c.bytes + t.nbytes

    sized = [t for t in gguf.tensors.values() if t.nbytes is not None]
    tensor_bytes = sum(t.nbytes for t in sized)
    sized_params = sum(t.n_elements for t in sized if not _is_companion(t.name, gguf))
    per_token = tensor_bytes
    emb = gguf.tensors.get(EMBEDDING)
    arch = gguf.metadata.get("general.architecture")
    if emb is not None and emb.nbytes is not None and not _tied_head(gguf, arch):
        per_token -= emb.nbytes - emb.nbytes // emb.n_out
    lane = gguf.metadata.get(LANE_KEY)
    return Summary(
        file=str(gguf.path), file_bytes=gguf.file_size, version=gguf.version,
        architecture=arch if isinstance(arch, str) else None,
        lane=lane if isinstance(lane, str) else None,
        tensors=len(gguf.tensors), classes=list(classes.values()),
        parameters=sum(c.params for c in classes.values()),
        tensor_bytes=tensor_bytes,
        bits_per_weight=tensor_bytes * 8 / sized_params if sized_params else None,
        bytes_per_token=per_token,
        unsized_tensors=len(gguf.tensors) - len(sized))


def format_table(s: Summary) -> str:
    head = ("label", "dtype", "shape (n_in→n_out)", "count", "bytes")
    rows = [(c.label, c.dtype, c.shape, f"{c.count:,}",
             "?" if c.bytes is None else f"{c.bytes:,}") for c in s.classes]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    right = (False, False, False, True, True)

    def line(r):
        return "  ".join(v.rjust(w) if rj else v.ljust(w)
                         for v, w, rj in zip(r, widths, right)).rstrip()

    out = [line(head), line(tuple("─" * w for w in widths)), *map(line, rows), ""]
    bpw = "?" if s.bits_per_weight is None else f"{s.bits_per_weight:.2f}"
    totals = [
        ("file", f"{s.file} (GGUF v{s.version}, {s.file_bytes:,} bytes)"),
        ("architecture", s.architecture or "-"),
        ("tensors", f"{s.tensors:,}"),
        ("parameters", f"{s.parameters:,}"),
        ("tensor bytes", f"{s.tensor_bytes:,}"),
        ("bits per weight", bpw),
        ("bytes per token", f"{s.bytes_per_token:,}"),
        ("lane", s.lane or f"- (no {LANE_KEY})"),
    ]
    if s.unsized_tensors:
        totals.append(("note", f"{s.unsized_tensors} tensor(s) of unknown type size are "
                               f"left out of the byte totals"))
    kw = max(len(k) for k, _ in totals)
    out += [f"{k.ljust(kw)}  {v}" for k, v in totals]
    return "\n".join(out)


def to_json(s: Summary) -> dict[str, Any]:
    d = asdict(s)
    for c, raw in zip(s.classes, d["classes"]):
        raw["shape"] = c.shape
    return d


def main(args: argparse.Namespace) -> int:
    """Each file in turn; one that cannot be read gets a one-line error on
    stderr and the others are still shown (exit status 2 if any failed)."""
    failed = False
    for i, name in enumerate(args.files):
        try:
            s = summarize(load_gguf(name, progress=True))  # the bar appears only after 1 s
        except (ValueError, OSError) as e:   # GGUFError included
            print(f"muser-torch inspect: error: {e}", file=sys.stderr)
            failed = True
            continue
        if args.json:
            print(json.dumps(to_json(s), ensure_ascii=False), flush=True)
        else:
            print(("\n" if i else "") + format_table(s), flush=True)
    return 2 if failed else 0


def register(subparsers: "argparse._SubParsersAction") -> None:
    p = subparsers.add_parser(
        "inspect", help="tensor classes, sizes and lane of GGUF files",
        description=__doc__.splitlines()[0],
        epilog="With several files (e.g. demo/*.gguf) the tables follow one another; "
               "--json prints one JSON object per file, one per line (JSON Lines), so a "
               "single file gives a single object.")
    p.add_argument("files", nargs="+", metavar="FILE", help="one or more .gguf files")
    p.add_argument("--json", action="store_true",
                   help="one JSON object per file, one per line (JSON Lines)")
    p.set_defaults(func=main)
