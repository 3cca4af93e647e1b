"""Split GGUF files (``gguf_io.split``): the parts of one model open as the
unsplit file would, each part memory-mapped; a missing or foreign part is a
``SplitFileError`` naming it. Parts are written by gguf-py's own writer (the
layout llama.cpp's ``gguf-split`` produces) and, for the bad cases, by ours."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType, GGUFValueType

from muser_torch import load_gguf, save_gguf
from muser_torch.config import GlimmerConfig
from muser_torch.errors import SplitFileError
from muser_torch.gguf_io.split import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT, part_path

from .helpers import fresh_seed
from .split_files import split_with_gguf_py
from .test_loader import CFG, glimmer_tensors

SPLIT_TYPES = {SPLIT_NO: GGUFValueType.UINT16, SPLIT_COUNT: GGUFValueType.UINT16,
               SPLIT_TENSORS_COUNT: GGUFValueType.INT32}


def write_parts(prefix: Path, metadata: dict, parts: list[dict], *, count: int | None = None,
                total: int | None = None, numbers: list[int] | None = None) -> list[Path]:
    """Parts written by ``save_gguf``, the first with ``metadata``; ``count``,
    ``total`` and ``numbers`` override the split keys to make bad parts."""
    count = len(parts) if count is None else count
    total = sum(map(len, parts)) if total is None else total
    paths = []
    for i, tensors in enumerate(parts):
        no = i if numbers is None else numbers[i]
        md = {SPLIT_NO: no, SPLIT_COUNT: count, SPLIT_TENSORS_COUNT: total}
        if i == 0:
            md = metadata | md
        path = part_path(prefix, i, len(parts))
        save_gguf(path, md, tensors, types=SPLIT_TYPES)
        paths.append(path)
    return paths


@pytest.fixture
def model(tmp_path):
    """An unsplit tiny Muse Glimmer of random tensors, and its tensors split in three."""
    seed = fresh_seed()
    tensors = glimmer_tensors(CFG, np.random.default_rng(seed))
    md = CFG.to_metadata()
    whole = tmp_path / "whole.gguf"
    save_gguf(whole, md, tensors)
    names = list(tensors)
    thirds = [dict((n, tensors[n]) for n in names[i::3]) for i in range(3)]
    return whole, md, thirds, seed


def test_gguf_py_parts_open_as_the_whole_file(tmp_path, model):
    whole_path, _, _, seed = model
    paths = split_with_gguf_py(whole_path, tmp_path / "glimmer", tensors_per_part=7)
    assert len(paths) >= 3 and all(p.exists() for p in paths)
    whole, split = load_gguf(whole_path), load_gguf(paths[0])
    assert split.parts == tuple(paths)
    assert split.metadata == whole.metadata
    assert split.metadata_types == whole.metadata_types
    assert list(split.tensors) == list(whole.tensors)
    for name, t in whole.tensors.items():
        s = split[name]
        assert (s.type_id, s.ne) == (t.type_id, t.ne), name
        assert torch.equal(s.raw, t.raw), f"seed {seed} {name}"
    assert split.file_size == sum(p.stat().st_size for p in paths)


def test_parts_are_memory_mapped_not_copied(tmp_path, model):
    whole_path, _, _, _ = model
    paths = split_with_gguf_py(whole_path, tmp_path / "glimmer", tensors_per_part=7)
    split = load_gguf(paths[0])
    last = list(split.tensors.values())[-1]
    assert last._buf.base is not None and last._buf.size == paths[-1].stat().st_size, \
        "the last tensor does not view its own part's map"
    assert last.packed.data_ptr() == last.raw.data_ptr() == last._buf.ctypes.data + last.offset


def test_from_gguf_runs_a_split_model_as_the_whole(tmp_path):
    from muser_torch import from_gguf
    from muser_torch.tiny import write_tiny
    cfg = GlimmerConfig(context_length=32, hidden=256, ffn=256, n_layers=2, n_heads=2,
                        n_kv_heads=1, head_dim=128, rms_eps=1e-6, sliding_window=8,
                        sliding_window_pattern=2, rope_base=10000.0, vocab_size=258)
    whole = tmp_path / "tiny.gguf"
    write_tiny(whole, cfg, seed=fresh_seed())
    paths = split_with_gguf_py(whole, tmp_path / "tiny", tensors_per_part=9)
    ids = torch.tensor([[1, 70, 101, 33, 9]])
    with torch.no_grad():
        want = from_gguf(whole)(ids)
        got = from_gguf(paths[0])(ids)
    assert torch.equal(got, want)


def test_inspect_and_run_take_the_first_part(tmp_path, model):
    whole_path, _, _, _ = model
    paths = split_with_gguf_py(whole_path, tmp_path / "glimmer", tensors_per_part=7)
    out = subprocess.run([sys.executable, "-m", "muser_torch.cli", "inspect", "--json",
                          str(paths[0])], capture_output=True, text=True, cwd=Path.cwd())
    assert out.returncode == 0, out.stderr
    assert f'"tensors": {len(load_gguf(whole_path).tensors)}' in out.stdout
    out = subprocess.run([sys.executable, "-m", "muser_torch.cli", "inspect", str(paths[1])],
                         capture_output=True, text=True)
    assert out.returncode == 2
    assert "open the first part" in out.stderr and out.stderr.count("\n") == 1


def test_opening_a_later_part_names_the_first(tmp_path, model):
    whole_path, _, _, _ = model
    paths = split_with_gguf_py(whole_path, tmp_path / "glimmer", tensors_per_part=7)
    with pytest.raises(SplitFileError, match=f"part 2 of {len(paths)}.*{paths[0].name}"):
        load_gguf(paths[1])


def test_missing_part(tmp_path, model):
    _, md, thirds, _ = model
    paths = write_parts(tmp_path / "m", md, thirds)
    paths[2].unlink()
    with pytest.raises(SplitFileError, match=f"{paths[2].name}: part 3 of 3 .* is missing"):
        load_gguf(paths[0])


@pytest.mark.parametrize("own", ["wrong count", "another model"])
def test_a_part_whose_split_keys_disagree(tmp_path, model, own):
    """Part 2 says 4 parts, or is part 2 of a 3-part model of 5 tensors."""
    _, md, thirds, _ = model
    total = sum(map(len, thirds))
    paths = write_parts(tmp_path / "m", md, thirds)
    if own == "wrong count":
        keys, tensors, match = {SPLIT_COUNT: 4, SPLIT_TENSORS_COUNT: total}, thirds[1], \
            "split.count is 4, expected 3"
    else:
        keys, tensors, match = {SPLIT_COUNT: 3, SPLIT_TENSORS_COUNT: 5}, \
            {"other.weight": (GGMLQuantizationType.F32, torch.randn(3, 32))}, \
            f"split.tensors.count is 5, expected {total}.*another model"
    save_gguf(paths[1], {SPLIT_NO: 1} | keys, tensors, types=SPLIT_TYPES)
    with pytest.raises(SplitFileError, match=f"{paths[1].name}: {match}"):
        load_gguf(paths[0])


def test_wrong_split_index(tmp_path, model):
    _, md, thirds, _ = model
    paths = write_parts(tmp_path / "m", md, thirds, numbers=[0, 2, 2])
    with pytest.raises(SplitFileError, match=f"{paths[1].name}: split.no is 2, expected 1"):
        load_gguf(paths[0])


def test_duplicate_tensor(tmp_path, model):
    _, md, thirds, _ = model
    name = next(iter(thirds[0]))
    third = dict(thirds[2]) | {name: thirds[0][name]}
    paths = write_parts(tmp_path / "m", md, [thirds[0], thirds[1], third])
    with pytest.raises(SplitFileError, match=f"{paths[2].name}: tensor '{name}' is also in "
                                             f"{paths[0].name}"):
        load_gguf(paths[0])


def test_tensor_total_disagrees(tmp_path, model):
    _, md, thirds, _ = model
    total = sum(map(len, thirds))
    paths = write_parts(tmp_path / "m", md, thirds, total=total + 1)
    with pytest.raises(SplitFileError, match=f"split.tensors.count is {total + 1}, but the 3 "
                                             f"parts hold {total} tensors"):
        load_gguf(paths[0])


def test_first_part_must_carry_the_part_name(tmp_path, model):
    _, md, thirds, _ = model
    paths = write_parts(tmp_path / "m", md, thirds)
    renamed = paths[0].rename(tmp_path / "model.gguf")
    with pytest.raises(SplitFileError, match="model.gguf: split.count is 3, so the file must be "
                                             "named <prefix>-00001-of-00003.gguf"):
        load_gguf(renamed)


def test_part_without_split_keys(tmp_path, model):
    _, md, thirds, _ = model
    paths = write_parts(tmp_path / "m", md, thirds)
    save_gguf(paths[2], {}, thirds[2])
    with pytest.raises(SplitFileError, match=f"{paths[2].name}: split.no is missing"):
        load_gguf(paths[0])
