"""The resident pages of the files ``reader`` maps: ``release`` drops a
tensor's pages from this process's resident set, ``populate`` maps them in.

A weight the CPU runs on a copy (``QLinear.repacked``: the same bytes moved
into panels) needs its file bytes only when some other path reads them (the
embedding's rows of a tied lm_head, the torch fallback, ``state_dict``), yet
the repack read every page of them, and a read page stays in the resident set
as long as the map lives: +178 MB for Gemma 3 270M's tied lm_head beside its
copy. The maps are read-only views of the file (``mmap.ACCESS_READ``), so
``madvise(MADV_DONTNEED)`` on them loses nothing: a page dropped is read
again from the file (or the page cache) if it is touched again.

On any other memory ``MADV_DONTNEED`` would lose data (an anonymous page
comes back as zeros), so ``release`` acts only on the maps ``reader``
registered, and only on the pages lying wholly inside the tensor (a page it
shares with a neighbour stays). A tensor that views no registered map (a
copy, a quantized weight, another device) is left alone.
"""
from __future__ import annotations

import mmap
import weakref

import torch

__all__ = ["PAGE", "register", "mapped", "release", "release_span", "populate"]

PAGE = mmap.PAGESIZE
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)    # absent where madvise is (Windows)

# id(map) -> (its first address, its length, a weak reference to it)
_maps: dict[int, tuple[int, int, "weakref.ref[mmap.mmap]"]] = {}


def register(mm: mmap.mmap, address: int) -> None:
    """Note a read-only file map that starts at ``address`` (``reader``
    calls this for each file it opens); forgotten when the map is collected."""
    key = id(mm)
    _maps[key] = (address, len(mm), weakref.ref(mm, lambda _, k=key: _maps.pop(k, None)))


def mapped(t: torch.Tensor) -> tuple[mmap.mmap, int, int] | None:
    """``(map, first byte, end byte)`` of a contiguous CPU tensor that lies
    inside a registered file map (offsets into the map), else None."""
    if not isinstance(t, torch.Tensor) or not t.is_cpu or not t.is_contiguous() or t.numel() == 0:
        return None
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    for address, length, ref in list(_maps.values()):
        mm = ref()
        if mm is not None and not mm.closed and address <= start and end <= address + length:
            return mm, start - address, end - address
    return None


def release(t: torch.Tensor) -> int:
    """Drop from the resident set the pages wholly inside ``t``'s bytes when
    ``t`` views a registered file map; returns the bytes dropped (0 for a
    tensor that views none, or where madvise is missing). ``t``'s values are
    unchanged: its pages are read from the file again when touched."""
    where = mapped(t)
    return 0 if where is None else release_span(*where)


def release_span(mm: mmap.mmap, first: int, end: int) -> int:
    """``release`` of the bytes [first, end) of a read-only file map (``reader``
    drops its header once the metadata is read into Python values)."""
    first = -(-first // PAGE) * PAGE     # inward: a page shared with a neighbour stays
    end = min(end, len(mm)) // PAGE * PAGE
    if end <= first or _DONTNEED is None:
        return 0
    mm.madvise(_DONTNEED, first, end - first)
    return end - first


def populate(t: torch.Tensor) -> int:
    """Map every page of a file-mapped ``t`` into the resident set now (one
    read per page), so a first call does not take the page faults; returns
    the bytes mapped (0 for a tensor that views no registered map)."""
    where = mapped(t)
    if where is None:
        return 0
    flat = t.reshape(-1).view(torch.uint8)
    # a read of one byte in each page the tensor covers (its first whole page
    # onward, then the first and the last byte for the partial pages at its ends)
    flat[(-t.data_ptr()) % PAGE::PAGE].sum()
    flat[[0, -1]].sum()
    return flat.numel()
