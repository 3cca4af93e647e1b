"""What ``from_gguf`` leaves resident on the CPU, read from Linux's own
accounting (``tests/resident.py``: /proc/self/pagemap and smaps), on a random
llama file whose every matrix is Q8_0 (a type with a packed kernel on every
CPU the library runs on) and whose lm_head is tied to the embedding.

- ggml numerics, after load, a prefill and a decode step: no page wholly
  inside a repacked weight is resident (the tied embedding reads its rows
  from the lm_head's repack), and the file's mapping holds at most the
  file's other bytes (smaps ``Rss``).
- The twins: with ``pages.release`` a no-op every page of every weight
  stays resident; with the embedding unlinked from the repack the table's
  pages come back, each within the kernel's fault-around window (measured
  here: 64 KiB by default) of a row the forward read.
- The values: every weight still holds the file's bytes (read back with
  ``open().read()``); the embedding's rows equal gguf's numpy dequantize of
  the file's rows; the released model's logits equal, bit for bit, those of
  the same file run on its rows with the repack off.
- The first call's work is done at load: every ggml weight holds its repack
  before any call, and in the exact numerics every page of every weight is
  resident after load.
The file and the prompt come from SEED (MUSER_TEST_SEED replays one)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import muser_torch
from muser_torch.gguf_io import pages
from muser_torch.nn import QLinear, set_repack

from ..resident import PAGE, fault_window, interior, mapping_rss, require_proc, resident_inside
from ..versions import require_transformers
from .conftest import SEED

PROMPT = 48


pytestmark = pytest.mark.usefixtures("repack_on")     # tests/conftest.py


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    require_transformers("the random llama file (its sentencepiece vocabulary)")
    from .hf_files import write_random_gguf
    path = tmp_path_factory.mktemp("resident") / "q8.gguf"
    # matrices of 34-204 pages each
    return write_random_gguf(path, "llama", seed=SEED, types=("Q8_0",), tied=True, hidden=512,
                             ffn=1536, n_heads=4, n_kv_heads=2)


def _weights(model) -> dict[str, QLinear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, QLinear)}


def _run(path, numerics: str = "ggml", unlink: bool = False):
    """The model after load, a PROMPT-token prefill and one decode step; the
    ids its embedding read and the last logits. ``unlink``: the embedding
    reads the file's rows (the twin)."""
    model = muser_torch.from_gguf(path, numerics=numerics)
    if unlink:
        model.tok_embeddings.read_rows_from(None)
    ids = torch.randint(0, model.config.vocab_size, (1, PROMPT),
                        generator=torch.Generator().manual_seed(SEED))
    slots = torch.arange(1)
    model.setup_cache(1, PROMPT + 2)
    with torch.no_grad():
        nxt = model(ids, slots, last_only=True)[:, -1].argmax(-1, keepdim=True)
        logits = model(nxt, slots)[:, -1]
    return model, torch.cat([ids.view(-1), nxt.view(-1)]), logits


def _resident(model) -> dict[str, np.ndarray]:
    """Per repacked weight, the addresses of its resident whole pages."""
    out = {}
    for name, m in _weights(model).items():
        assert m.repacked() is not None, f"{name}: not repacked (seed {SEED})"
        out[name] = resident_inside(m.packed)
    return out


def _file_rss_bound(path, model) -> int:
    """Bytes the file's mapping may hold: every byte outside the repacked
    weights' whole pages (the tied table counted once)."""
    released = sum(n for _, n in {interior(m.packed) for m in _weights(model).values()})
    return -(-(path.stat().st_size - released) // PAGE) * PAGE


def test_repacked_weights_leave_the_resident_set(q8_file):
    require_proc()
    model, _, _ = _run(q8_file)
    resident = {n: len(a) for n, a in _resident(model).items()}
    assert not any(resident.values()), f"resident pages inside repacked weights: {resident} (seed {SEED})"
    assert sum(interior(m.packed)[1] for m in _weights(model).values()) > 1000 * PAGE, "a test with teeth"
    rss = mapping_rss(q8_file, model.tok_embeddings.packed.data_ptr())
    bound = _file_rss_bound(q8_file, model)
    assert rss <= bound, f"the file's mapping holds {rss:,} B, at most {bound:,} expected (seed {SEED})"


def test_without_the_release_every_page_stays(q8_file, monkeypatch):
    """The twin: ``pages.release`` a no-op, the checks above fail."""
    require_proc()
    monkeypatch.setattr(pages, "release", lambda t: 0)
    model, _, _ = _run(q8_file)
    for name, addresses in _resident(model).items():
        assert len(addresses) == interior(_weights(model)[name].packed)[1] // PAGE, \
            f"{name}: pages left the resident set with no release (seed {SEED})"
    assert mapping_rss(q8_file, model.tok_embeddings.packed.data_ptr()) > _file_rss_bound(q8_file, model)


def test_an_embedding_on_the_files_rows_brings_its_pages_back(q8_file):
    """The twin of the embedding's link: unlinked, it reads the file, whose
    pages come back around the rows read, and nowhere else."""
    require_proc()
    window = fault_window(q8_file)
    model, ids, _ = _run(q8_file, unlink=True)
    emb = model.tok_embeddings.packed
    allowed = set()
    for i in ids.tolist():
        start = emb.data_ptr() + i * emb.shape[1]
        allowed.update(range(start // window, (start + emb.shape[1] - 1) // window + 1))
    resident = _resident(model)
    table = next(n for n, m in _weights(model).items() if m.shares_bytes(model.tok_embeddings))
    assert len(resident[table]) > 0, f"the table's pages stayed out though its rows were read (seed {SEED})"
    for name, addresses in resident.items():
        stray = [a for a in addresses if int(a) // window not in allowed]
        assert not stray, f"{name}: {len(stray)} pages resident away from the rows read (seed {SEED})"


def test_released_weights_hold_the_files_values(q8_file):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize
    model, ids, released = _run(q8_file)
    gguf = muser_torch.load_gguf(q8_file)
    base = model.tok_embeddings.packed.data_ptr() - gguf.tensors["token_embd.weight"].offset
    by_offset = {t.offset: t for t in gguf.tensors.values()}
    with open(q8_file, "rb") as f:
        for name, m in _weights(model).items():
            t = by_offset[m.packed.data_ptr() - base]
            f.seek(t.offset)
            assert bytes(m.packed.reshape(-1).numpy()) == f.read(t.nbytes), \
                f"{name}: its bytes are not the file's after the release (seed {SEED})"
        t = gguf.tensors["token_embd.weight"]
        row = t.nbytes // t.n_out
        raw = []
        for i in ids.tolist():
            f.seek(t.offset + i * row)
            raw.append(np.frombuffer(f.read(row), dtype=np.uint8))
    expect = gguf_dequantize(np.stack(raw), GGMLQuantizationType.Q8_0).reshape(len(ids), -1)
    with torch.no_grad():
        got = model.tok_embeddings(ids).float().numpy()
    assert np.array_equal(got, expect), f"embedding rows from the repack differ (seed {SEED})"
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
