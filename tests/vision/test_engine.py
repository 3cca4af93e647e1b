"""The vision engine (``models/vision_engine.py``): the vision forward recorded
once per patch grid and replayed.

On the CPU the engine runs with a recorder whose "recording" is the eager
forward itself, counted (as ``tests/models/test_engine.py`` does for the
decode engine): the buckets, the static pixel buffers, the plans, the LRU
bound and the invalidation all run here, and every row is held to the
plain tower's, bit for bit. Where CUDA exists, real CUDA graphs are held
to the eager engine (float32, within 1e-5) for an image and videos.

The tower is a small random projector (``tiny/mmproj.py``) over a 4 x 4
position table, so grids wider than 4 patches cross windows; pixels are
drawn fresh for every call (a stale static buffer gives the last call's rows)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import muser_torch
from muser_torch.arch.glimmer_vision import release_config
from muser_torch.cli import main as cli
from muser_torch.gguf_io import load_gguf
from muser_torch.models.engine import ENGINES, DecodeEngine
from muser_torch.models.vision_engine import MAX_GRIDS, VisionEngine, engine_choice, vision_engine
from muser_torch.nn import set_numerics
from muser_torch.tiny.mmproj import write_random_mmproj
from muser_torch.vision import Grid, Video, VisionTower

from ..bounds import check_bound
from .conftest import SEED

CUDA = torch.cuda.is_available()
TEXT_HIDDEN = 256
# grids: one window, two by two windows, a video of two temporal groups across windows
GRIDS = [Grid(1, 4, 4), Grid(1, 6, 10), Grid(2, 8, 6)]


class CountingRecorder:
    """A recorder for the CPU: recording returns the forward itself, counted."""

    def __init__(self):
        self.recorded = 0
        self.modes: list[str] = []

    def new_pool(self):
        return None

    def capture(self, fn, pool, mode="global"):
        self.recorded += 1
        self.modes.append(mode)
        return fn


@pytest.fixture(scope="module")
def small_mmproj(tmp_path_factory):
    """A 5-layer random projector, 256 wide, a 4 x 4 position table, F16."""
    cfg = replace(release_config(TEXT_HIDDEN, 5), hidden=256, ffn=512, n_heads=4, adapter_hidden=256,
                  pos_side=4)
    return write_random_mmproj(tmp_path_factory.mktemp("vision-engine") / "mmproj.gguf", cfg, "f16",
                               seed=SEED % 1000)


def tower_of(path) -> VisionTower:
    return VisionTower.from_gguf(load_gguf(path), text_hidden=TEXT_HIDDEN)


def pixels_for(tower: VisionTower, grid: Grid, gen: torch.Generator, device="cpu") -> torch.Tensor:
    return torch.randn(grid.t, grid.h * grid.w, tower.config.patch_pixels, generator=gen).to(device)


def test_recorded_rows_are_the_towers_bit_for_bit(small_mmproj):
    tower = tower_of(small_mmproj)
    recorder = CountingRecorder()
    engine = VisionEngine(tower, recorder)
    gen = torch.Generator().manual_seed(SEED)
    kept = []
    with torch.no_grad():
        for rnd in range(4):                    # eager, record, replay, replay
            for grid in GRIDS:
                px = pixels_for(tower, grid, gen)
                got = engine.rows(px, grid)
                want = tower(px, grid)
                assert got.shape == (grid.rows(2), TEXT_HIDDEN)
                assert torch.equal(got, want), f"grid {grid}, call {rnd + 1}: rows differ (SEED={SEED})"
                kept.append((got, want))
        # the rows returned are the caller's: later calls left them as they were
        assert all(torch.equal(got, want) for got, want in kept)
    assert engine.captures == recorder.recorded == len(GRIDS), "each grid records once, on its second call"
    assert recorder.modes == ["thread_local"] * len(GRIDS)
    assert engine.grids == GRIDS and engine.evictions == 0


class FailingRecorder(CountingRecorder):
    """A recorder whose recording fails, as a capture can on a device."""

    def capture(self, fn, pool, mode="global"):
        super().capture(fn, pool, mode)
        raise RuntimeError("operation not permitted when stream is capturing")


def test_a_failed_recording_is_said_and_runs_eagerly(small_mmproj):
    tower = tower_of(small_mmproj)
    recorder = FailingRecorder()
    engine = VisionEngine(tower, recorder)
    gen = torch.Generator().manual_seed(SEED + 7)
    grid = GRIDS[1]
    with torch.no_grad():
        px = pixels_for(tower, grid, gen)
        assert torch.equal(engine.rows(px, grid), tower(px, grid))       # eager, first call
        px = pixels_for(tower, grid, gen)
        with pytest.warns(RuntimeWarning, match="could not be recorded.*stream is capturing"):
            got = engine.rows(px, grid)
        assert torch.equal(got, tower(px, grid)), f"the failed recording's call (SEED={SEED})"
        px = pixels_for(tower, grid, gen)
        assert torch.equal(engine.rows(px, grid), tower(px, grid)), "later calls run eagerly"
    assert recorder.recorded == 1 and not engine.records and engine.captures == 0


def test_recordings_are_dropped_when_the_tower_changes(small_mmproj):
    tower = tower_of(small_mmproj)
    engine = VisionEngine(tower, CountingRecorder())
    gen = torch.Generator().manual_seed(SEED + 1)
    grid = GRIDS[1]

    def calls(n: int) -> None:
        for _ in range(n):
            px = pixels_for(tower, grid, gen)
            assert torch.equal(engine.rows(px, grid), tower(px, grid)), f"SEED={SEED}"

    with torch.no_grad():
        calls(4)
        assert engine.captures == 1, "a call without a change recorded again"
        tower.to("cpu")                         # an _apply: the tensors may be new ones
        calls(1)
        assert engine.captures == 1, "the first call after a change runs eagerly"
        calls(2)
        assert engine.captures == 2
        set_numerics(tower, "ggml")             # another arithmetic for every projection
        calls(3)
        assert engine.captures == 3


def test_grids_past_the_bound_are_evicted_least_recent_first(small_mmproj):
    tower = tower_of(small_mmproj)
    engine = VisionEngine(tower, CountingRecorder(), max_grids=2)
    gen = torch.Generator().manual_seed(SEED + 2)
    a, b, c, d = Grid(1, 4, 4), Grid(1, 4, 6), Grid(1, 6, 4), Grid(1, 2, 8)

    def twice(grid: Grid) -> None:
        for _ in range(2):
            px = pixels_for(tower, grid, gen)
            assert torch.equal(engine.rows(px, grid), tower(px, grid)), f"grid {grid} (SEED={SEED})"

    with torch.no_grad():
        twice(a)
        twice(b)
        assert engine.grids == [a, b] and engine.captures == 2
        twice(c)                                # a goes: the least recently used
        assert engine.grids == [b, c] and engine.evictions == 1 and engine.captures == 3
        twice(b)                                # a replay of b: b is the most recent now
        assert engine.grids == [c, b] and engine.captures == 3
        twice(d)                                # c goes, not b
        assert engine.grids == [b, d] and engine.evictions == 2
        twice(a)                                # a again: recorded anew
        assert engine.grids == [d, a] and engine.captures == 5
    assert 2 <= MAX_GRIDS <= 16
    with pytest.raises(ValueError, match="max_grids must be >= 1, got 0"):
        VisionEngine(tower, CountingRecorder(), max_grids=0)
    with pytest.raises(ValueError, match=r"pixels of shape \(1, 16, 588\) for grid"):
        engine.rows(torch.zeros(1, 16, 588), Grid(1, 4, 6))


def test_engine_choices(small_mmproj):
    tower, other = tower_of(small_mmproj), tower_of(small_mmproj)
    assert ENGINES == ("auto", "graph", "eager")
    assert not vision_engine(tower, "eager").records
    assert vision_engine(tower, "auto") is vision_engine(tower, "eager")   # the CPU records nothing
    mine = VisionEngine(tower, CountingRecorder())
    assert vision_engine(tower, mine) is mine
    with pytest.raises(ValueError, match="engine must be one of auto, graph, eager, got 'fast'"):
        vision_engine(tower, "fast")
    with pytest.raises(ValueError, match="runs the tower it was made for"):
        vision_engine(other, mine)
    if not CUDA:
        with pytest.raises(ValueError, match="engine='graph': a vision forward on cpu cannot be recorded"):
            vision_engine(tower, "graph")
    assert engine_choice("eager") == "eager"
    assert engine_choice(DecodeEngine(torch.nn.Linear(1, 1), CountingRecorder())) == "auto"
    assert engine_choice(DecodeEngine(torch.nn.Linear(1, 1))) == "eager"


def _model(tmp_path, mmproj, device: str):
    text = tmp_path / "text.gguf"
    assert cli(["make-tiny", str(text), "--hidden", str(TEXT_HIDDEN), "--layers", "2",
                "--seed", str(SEED % 1000)]) == 0
    return muser_torch.from_gguf(text, device=device, dtype=torch.float32, mmproj=mmproj)


def _png(tmp_path, h: int, w: int, salt: int):
    from PIL import Image
    gen = torch.Generator().manual_seed(SEED + salt)
    path = tmp_path / f"im-{h}x{w}-{salt}.png"
    Image.fromarray(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=gen).numpy()).save(path)
    return path


def _inputs(model, tmp_path):
    """An image (2 x 2 windows) and videos of 2 and 4 frames (1 and 2 temporal groups)."""
    image = _png(tmp_path, 100, 150, 0)
    frames = [_png(tmp_path, 90, 70, 1 + i) for i in range(4)]
    return model.prepare_visual([image], [Video(frames[:2], timestamps=[0.0, 0.5]),
                                          Video(frames, timestamps=[0.0, 0.5, 1.0, 1.5])])


def test_visual_rows_run_on_the_engine(small_mmproj, tmp_path):
    """``Glimmer.visual_rows`` through a recording engine gives the eager rows."""
    model = _model(tmp_path, small_mmproj, "cpu")
    inputs = _inputs(model, tmp_path)
    assert [x.grid.t for x in inputs] == [1, 1, 2]
    engine = VisionEngine(model.vision, CountingRecorder())
    want = model.visual_rows(inputs, "eager")
    for _ in range(3):
        got = model.visual_rows(inputs, engine)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), f"SEED={SEED}"
    assert engine.captures == len({x.grid for x in inputs})


@pytest.mark.skipif(not CUDA, reason="needs CUDA (CUDA graphs)")
def test_graph_rows_agree_with_eager_on_cuda(small_mmproj, tmp_path):
    """Recorded and replayed in CUDA graphs: the rows of an image, a 2-frame
    video and a 4-frame one within 1e-5 of the eager engine's (float32), on the
    recording call and on replays of fresh pixels."""
    model = _model(tmp_path, small_mmproj, "cuda")
    inputs = _inputs(model, tmp_path)
    engine = vision_engine(model.vision, "graph")
    assert engine.records
    before = engine.captures
    with torch.no_grad():
        for rnd in range(3):                    # eager, record, replay
            for x in inputs:
                got = model.visual_rows([x], "graph")[0]
                want = model.visual_rows([x], "eager")[0]
                err = float((got - want).norm() / want.norm())
                check_bound("vision graph: rel err to eager", err, 1e-5,
                            f"{x.kind} grid {x.grid}, call {rnd + 1} (SEED={SEED})")
        # fresh pixels through a replay: the static buffer is read anew
        x = inputs[0]
        shifted = replace(x, pixels=x.pixels.flip(1).contiguous())
        got = model.visual_rows([shifted], "graph")[0]
        want = model.visual_rows([shifted], "eager")[0]
        check_bound("vision graph: rel err to eager", float((got - want).norm() / want.norm()), 1e-5,
                    f"replay of new pixels (SEED={SEED})")
    assert engine.captures - before == len({x.grid for x in inputs})
