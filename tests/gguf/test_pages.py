"""``gguf_io.pages``: the resident pages of a file's map, released and mapped
in, as Linux itself counts them (/proc/self/pagemap and smaps, through
``tests/resident.py``).

- ``populate`` maps every page of a tensor; ``release`` then drops each page
  wholly inside it (and keeps the pages it shares with its neighbours), the
  mapping's smaps ``Rss`` falling by what it says it dropped; the tensor's
  values afterwards are the file's bytes, read back with ``open().read()``.
- ``release`` leaves everything that views no file map alone: a clone, a
  fresh tensor (``MADV_DONTNEED`` would zero an anonymous page), a tensor
  from a closed file's map. The twin: the same check with ``populate`` and no
  release finds the pages resident, so the check can fail.
Fresh random bytes each run (MUSER_TEST_SEED replays one)."""
from __future__ import annotations

import gc

import torch

from muser_torch import GGMLType, load_gguf, save_gguf
from muser_torch.gguf_io import pages

from ..resident import PAGE, interior, mapping_rss, present, require_proc, resident_inside
from .helpers import fresh_seed

# rows of 34 bytes (one Q8_0 block a row); sizes chosen so no tensor starts on a page
ROWS = {"a.weight": 3001, "b.weight": 977, "c.weight": 5003}


def _write(path, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    data = {n: torch.randint(0, 256, (r, 34), dtype=torch.uint8, generator=g) for n, r in ROWS.items()}
    save_gguf(path, {"general.architecture": "test"},
              {n: (GGMLType.Q8_0, d) for n, d in data.items()}, progress=False)
    return data


def _file_bytes(path, t) -> bytes:
    with open(path, "rb") as f:
        f.seek(t.offset)
        return f.read(t.nbytes)


def test_release_drops_the_pages_inside_a_tensor_and_keeps_its_values(tmp_path):
    require_proc()
    seed = fresh_seed()
    path = tmp_path / "m.gguf"
    _write(path, seed)
    f = load_gguf(path)
    for name in ROWS:
        t = f.tensors[name]
        packed = t.packed
        first, n = interior(packed)
        assert n >= 8 * PAGE, f"{name}: the test needs a tensor of several pages (seed {seed})"
        assert pages.populate(packed) == t.nbytes
        assert len(resident_inside(packed)) == n // PAGE, f"{name}: populate left pages out (seed {seed})"
        rss = mapping_rss(path, packed.data_ptr())
        dropped = pages.release(packed)
        assert dropped == n, f"{name}: released {dropped} B, its whole pages are {n} B (seed {seed})"
        assert len(resident_inside(packed)) == 0, f"{name}: pages still resident (seed {seed})"
        # the pages it shares with its neighbours stay (populate read them)
        for edge in (packed.data_ptr(), packed.data_ptr() + t.nbytes - 1):
            if not first <= edge < first + n:
                assert present(edge, 1).all(), f"{name}: a page shared with a neighbour was dropped"
        after = mapping_rss(path, packed.data_ptr())
        assert rss - after == n, (f"{name}: smaps Rss fell by {rss - after} B, released {n} B "
                                  f"(seed {seed})")
        assert bytes(packed.reshape(-1).numpy()) == _file_bytes(path, t), \
            f"{name}: values changed by the release (seed {seed})"


def test_populate_without_release_is_seen_resident(tmp_path):
    """The twin of the test above: without the release the check finds pages."""
    require_proc()
    path = tmp_path / "m.gguf"
    _write(path, fresh_seed())
    packed = load_gguf(path).tensors["c.weight"].packed
    pages.populate(packed)
    assert len(resident_inside(packed)) == interior(packed)[1] // PAGE > 0


def test_release_leaves_memory_that_views_no_file_map_alone(tmp_path):
    seed = fresh_seed()
    path = tmp_path / "m.gguf"
    data = _write(path, seed)
    f = load_gguf(path)
    packed = f.tensors["c.weight"].packed
    copy = packed.clone()
    fresh = torch.randint(0, 256, (4 * PAGE,), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(seed))
    kept = fresh.clone()
    for what, t in (("a clone of a map's tensor", copy), ("a fresh tensor", fresh),
                    ("a non-contiguous view of a map", packed[:, ::2])):
        assert pages.mapped(t) is None, f"{what} taken for a file's map (seed {seed})"
        assert pages.release(t) == 0 and pages.populate(t) == 0, what
    assert torch.equal(copy, data["c.weight"]) and torch.equal(fresh, kept), f"seed {seed}"
    assert pages.mapped(packed) is not None


def test_a_map_is_forgotten_when_it_is_collected(tmp_path):
    """No address of a map that is gone can be taken for a live map's."""
    path = tmp_path / "m.gguf"
    _write(path, fresh_seed())
    gc.collect()
    before = len(pages._maps)
    f = load_gguf(path)
    assert len(pages._maps) == before + 1
    del f
    gc.collect()
    assert len(pages._maps) == before
