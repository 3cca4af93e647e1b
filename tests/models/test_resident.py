"""What ``from_gguf`` leaves resident on the CPU, read from Linux's own
accounting (``tests/resident.py``: /proc/self/pagemap and smaps), on a random
llama file whose every matrix is Q8_0 (a type with a packed kernel on every
CPU the library runs on) and whose lm_head is tied to the embedding.

- ggml numerics, after load, a prefill and a decode step: no page wholly
  inside a repacked weight is resident, except within the kernel's
  fault-around window (measured here: 64 KiB by default) of an embedding row
  the forward read (the tied lm_head's bytes are the embedding's table); the
  mapping's smaps ``Rss`` stays within the file's other bytes plus those
  windows. The twin: the same run with ``pages.release`` a no-op leaves
  pages inside every weight and the mapping over that bound.
- The values: every weight still holds the file's bytes (read back with
  ``open().read()``), and the released model's logits equal, bit for bit,
  those of the same file run on its rows with the repack off.
- The first call's work is done at load: every ggml weight holds its repack
  before any call, and in the exact numerics every page of every weight is
  resident after load.
The file and the prompt come from SEED (MUSER_TEST_SEED replays one)."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.gguf_io import pages
from muser_torch.nn import QLinear, set_repack

from ..resident import PAGE, fault_window, interior, mapping_rss, require_proc, resident_inside
from ..versions import require_transformers
from .conftest import SEED

PROMPT = 48


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    require_transformers("the random llama file (its sentencepiece vocabulary)")
    from .hf_files import write_random_gguf
    path = tmp_path_factory.mktemp("resident") / "q8.gguf"
    # matrices of 34-204 pages, so most of each lies outside any window around its edges
    return write_random_gguf(path, "llama", seed=SEED, types=("Q8_0",), tied=True, hidden=512,
                             ffn=1536, n_heads=4, n_kv_heads=2)


def _weights(model) -> dict[str, QLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QLinear)}


def _run(path, numerics: str = "ggml"):
    """The model after load, a PROMPT-token prefill and one decode step; the
    ids its embedding read and the last logits."""
    model = muser_torch.from_gguf(path, numerics=numerics)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(SEED))
    slots = torch.arange(1)
    model.setup_cache(1, PROMPT + 2)
    with torch.no_grad():
        nxt = model(ids, slots, last_only=True)[:, -1].argmax(-1, keepdim=True)
        logits = model(nxt, slots)[:, -1]
    return model, torch.cat([ids.view(-1), nxt.view(-1)]), logits


def _allowed_windows(model, ids: torch.Tensor, window: int) -> set[int]:
    """The fault-around windows (address // window) of the embedding rows read."""
    emb = model.tok_embeddings.packed
    row = emb.shape[1]
    out = set()
    for i in ids.tolist():
        start = emb.data_ptr() + i * row
        out.update(range(start // window, (start + row - 1) // window + 1))
    return out


def _strays(model, ids: torch.Tensor, window: int) -> dict[str, tuple[int, int]]:
    """Per repacked weight: (its resident pages outside the allowed windows,
    its pages outside them: those the check can see)."""
    allowed = _allowed_windows(model, ids, window)
    out = {}
    for name, m in _weights(model).items():
        assert m.repacked() is not None, f"{name}: not repacked (seed {SEED})"
        first, n = interior(m.packed)
        seen = sum((first + k * PAGE) // window not in allowed for k in range(n // PAGE))
        stray = sum(int(a) // window not in allowed for a in resident_inside(m.packed))
        out[name] = (stray, seen)
    return out


def _rss_bound(path, model, ids: torch.Tensor, window: int) -> int:
    """Bytes the file's mapping may hold: every byte outside the repacked
    weights' whole pages, plus the allowed windows."""
    size = path.stat().st_size
    inside = {interior(m.packed) for m in _weights(model).values()}     # the tied one once
    released = sum(n for _, n in inside)
    return -(-(size - released) // PAGE) * PAGE + len(_allowed_windows(model, ids, window)) * window


def test_repacked_weights_leave_the_resident_set(q8_file):
    require_proc()
    window = fault_window(q8_file)
    model, ids, _ = _run(q8_file)
    strays = _strays(model, ids, window)
    assert not any(s for s, _ in strays.values()), (
        f"resident pages inside repacked weights, outside the {window} B windows of the "
        f"embedding rows read (weight: (resident, pages checked)): {strays} (seed {SEED})")
    # the check sees most pages: all but the tied table the prompt's rows cover
    assert sum(seen for _, seen in strays.values()) > 1000, f"{strays} (seed {SEED})"
    rss = mapping_rss(q8_file, model.tok_embeddings.packed.data_ptr())
    bound = _rss_bound(q8_file, model, ids, window)
    assert rss <= bound, f"the file's mapping holds {rss:,} B, at most {bound:,} expected (seed {SEED})"
    gguf = muser_torch.load_gguf(q8_file)
    with open(q8_file, "rb") as f:
        for name, m in _weights(model).items():
            t = gguf.tensors[_gguf_name(model, m, gguf)]
            f.seek(t.offset)
            assert bytes(m.packed.reshape(-1).numpy()) == f.read(t.nbytes), \
                f"{name}: its bytes are not the file's after the release (seed {SEED})"


def _gguf_name(model, m: QLinear, gguf) -> str:
    """The file tensor a weight views (by its offset in the map)."""
    base = model.tok_embeddings.packed.data_ptr() - gguf.tensors["token_embd.weight"].offset
    at = m.packed.data_ptr() - base
    return next(n for n, t in gguf.tensors.items() if t.offset == at)


def test_without_the_release_pages_stay_resident(q8_file, monkeypatch):
    """The twin: ``pages.release`` a no-op, the checks above fail."""
    require_proc()
    window = fault_window(q8_file)
    monkeypatch.setattr(pages, "release", lambda t: 0)
    model, ids, _ = _run(q8_file)
    strays = _strays(model, ids, window)
    assert all(s == seen for s, seen in strays.values()), \
        f"a weight left the resident set with no release: {strays} (seed {SEED})"
    rss = mapping_rss(q8_file, model.tok_embeddings.packed.data_ptr())
    assert rss > _rss_bound(q8_file, model, ids, window)


def test_released_weights_compute_what_the_files_rows_do(q8_file):
    _, _, released = _run(q8_file)
    set_repack(False)
    try:
        rows_model, _, on_rows = _run(q8_file)
        assert all(m.repacked() is None for m in _weights(rows_model).values())
    finally:
        set_repack(True)
    assert torch.equal(released, on_rows), (f"logits differ by {(released - on_rows).abs().max():.3g} "
                                            f"(seed {SEED})")


def test_first_call_work_is_done_at_load(q8_file):
    require_proc()
    model = muser_torch.from_gguf(q8_file, numerics="ggml")
    for name, m in _weights(model).items():
        assert "_repacked" in m.__dict__, f"{name}: no repack made at load"
    model = muser_torch.from_gguf(q8_file, numerics="exact")
    for name, m in _weights(model).items():
        assert len(resident_inside(m.packed)) == interior(m.packed)[1] // PAGE, \
            f"{name}: pages of the weight not mapped in at load"
