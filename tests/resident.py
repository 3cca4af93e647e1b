"""Which pages of this process are resident, read from Linux's own accounting
(not from muser_torch): ``/proc/self/pagemap`` (bit 63 of a page's entry: the
page is mapped, so counted in the resident set) and ``/proc/self/smaps`` (a
mapping's ``Rss``). Tests that use these skip where /proc has neither."""
from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest
import torch

PAGE = mmap.PAGESIZE


def require_proc() -> None:
    for name in ("pagemap", "smaps"):
        if not os.access(f"/proc/self/{name}", os.R_OK):
            pytest.skip(f"/proc/self/{name} cannot be read here (not Linux, or no /proc)")


def present(address: int, nbytes: int) -> np.ndarray:
    """bool per page of [address, address + nbytes), page-aligned outward:
    whether this process has it mapped (resident)."""
    first = address // PAGE
    last = -(-(address + nbytes) // PAGE)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first) * 8), dtype=np.uint64)
    return ((entries >> np.uint64(63)) & np.uint64(1)).astype(bool)


def interior(t: torch.Tensor) -> tuple[int, int]:
    """(first address, bytes) of the pages wholly inside a contiguous tensor."""
    start, end = t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()
    first, last = -(-start // PAGE) * PAGE, end // PAGE * PAGE
    return first, max(0, last - first)


def resident_inside(t: torch.Tensor) -> np.ndarray:
    """The addresses of the resident pages wholly inside ``t``."""
    first, n = interior(t)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    return first + np.nonzero(present(first, n))[0].astype(np.int64) * PAGE


def mapping_rss(path: Path, address: int) -> int:
    """Bytes resident (smaps ``Rss``) of the mapping of ``path`` that holds ``address``."""
    want, inside = str(Path(path).resolve()), False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and len(head) >= 5 and not head[0].endswith(":"):
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                inside = lo <= address < hi and len(head) >= 6 and head[5] == want
            elif inside and head[0] == "Rss:":
                return int(head[1]) * 1024
    raise AssertionError(f"no mapping of {want} holds {address:#x} in /proc/self/smaps")


def fault_window(path: Path) -> int:
    """Bytes the kernel maps on one read fault of ``path`` (its fault-around:
    64 KiB by default): a fresh read-only map of the file, every page of it
    dropped, then one byte read in the middle."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        buf = np.frombuffer(mm, dtype=np.uint8)
        mm.madvise(mmap.MADV_DONTNEED, 0, len(mm) // PAGE * PAGE)
        at = len(mm) // 2 // PAGE * PAGE
        int(buf[at])
        got = int(present(buf.ctypes.data, len(mm) // PAGE * PAGE).sum()) * PAGE
        del buf
    finally:
        try:
            mm.close()
        except BufferError:
            pass
    return got
