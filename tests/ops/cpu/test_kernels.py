"""The native CPU library itself: it builds, decodes the types it claims with
the geometry of formats/types.py, and every token-group remainder of the fused
row kernels matches the float64 reference."""
from __future__ import annotations

import dataclasses
import random
import re
import shutil
from pathlib import Path

import pytest
import torch

import muser_torch.ops as ops
from muser_torch.formats import random_weight
from muser_torch.formats.types import GGMLType
from muser_torch.ops import cpu

from ..conftest import ALL_TYPES, NATIVE_TYPES, OTHER_MARCHES, Case, native_build_for, rel_err, x86_only


def test_native_builds_and_claims_its_types():
    assert cpu.native_available(), "the native CPU kernels failed to build"
    lib = cpu._native_lib()
    for qtype in GGMLType:
        claimed = lib.muser_geometry(int(qtype), qtype.block_elems, qtype.block_bytes) == 0
        assert claimed == (qtype in NATIVE_TYPES), qtype.name


def test_a_build_says_so_once(tmp_path, monkeypatch, capfd):
    """A build into an empty cache prints a line saying so, naming the cache,
    and one with its seconds; with the cache warm nothing is printed. The compiler's work is stood in for
    by a copy of this session's library (it is what a build makes)."""
    from muser_torch.ops.cpu import build
    assert cpu.native_available()
    built = Path(build._native_lib()._name).parent
    monkeypatch.setenv("MUSER_CACHE_DIR", str(tmp_path))
    compiles = []

    def compile_by_copy(cc, flags, sources, header, target):
        compiles.append(target)
        shutil.copytree(built, target)

    monkeypatch.setattr(build, "_compile", compile_by_copy)
    capfd.readouterr()
    build._build()
    cold = capfd.readouterr().err
    build._build()
    warm = capfd.readouterr().err
    assert len(compiles) == 1 and compiles[0].parent == tmp_path / "muser_torch", compiles
    notice, done = cold.splitlines()     # each on a line of its own, the second with the seconds
    assert notice == f"muser-torch: compiling CPU kernels (once, cached in {tmp_path / 'muser_torch'})", cold
    assert re.fullmatch(r"muser-torch: compiled CPU kernels in \d+\.\d s", done), cold
    assert warm == "", warm


@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda t: t.name)
def test_every_token_group_remainder(qtype, monkeypatch):
    """Rows are dotted with groups of up to 8 tokens (compile-time counts
    1..8): sweep 1..17 so every remainder and two full groups run (the fused
    rung forced up to the kernel's cap; the ladder hands it only
    cpu.FUSED_MAX_TOKENS)."""
    fused = dataclasses.replace(cpu.LADDER[0], max_tokens=cpu.NATIVE_MAX_TOKENS)
    monkeypatch.setattr(cpu, "LADDER", (fused, *cpu.LADDER[1:]))
    with cpu.use_native(True):
        assert cpu.rung_for(qtype, 17).name == "fused", "the fused rung was not forced"
    case = Case(qtype, 13, blocks=2)
    with cpu.use_native(True):
        for tokens in range(1, 18):
            x = case.randn(tokens, case.n_in)
            err = rel_err(ops.qmatmul(x, *case.args), x.double() @ case.weight64().T)
            assert err < 1e-5, f"{case} tokens={tokens}: relative error {err:.3g}"


@pytest.mark.parametrize("qtype", NATIVE_TYPES, ids=lambda t: t.name)
def test_gemm_every_panel_width(qtype):
    """The gemm packs tokens into panels of 16 or 32 (8 or 16 without
    AVX-512), the last one narrow or zero-padded: sweep 9..50 tokens."""
    case = Case(qtype, 13, blocks=2)
    with cpu.use_native(True):
        for tokens in range(cpu.FUSED_MAX_TOKENS + 1, 51):
            x = case.randn(tokens, case.n_in)
            err = rel_err(ops.qmatmul(x, *case.args), x.double() @ case.weight64().T)
            assert err < 1e-5, f"{case} tokens={tokens}: relative error {err:.3g}"


def test_rung_for_follows_the_ladder():
    """Each token count goes to the first rung of cpu.LADDER that covers it:
    among the native rungs for NATIVE_TYPES with the library on, among the
    torch rungs otherwise."""
    def expected(native: bool) -> list[tuple[int, cpu.Rung]]:
        out, lo = [], 1
        for rung in (r for r in cpu.LADDER if r.native == native):
            hi = rung.max_tokens or lo + 200
            out += [(lo, rung), (hi, rung)]
            lo = hi + 1
        return out

    for enabled in (True, False):
        with cpu.use_native(enabled):
            for qtype in GGMLType:
                for tokens, rung in expected(enabled and qtype in NATIVE_TYPES):
                    got = cpu.rung_for(qtype, tokens)
                    assert got is rung, (f"{qtype.name} tokens={tokens} native={enabled}: "
                                         f"{got.name}, the ladder says {rung.name}")


@pytest.mark.parametrize("rung", cpu.LADDER, ids=lambda r: r.name)
def test_every_rung_matches_float64(rung):
    """Each rung's kernel, called directly, at its first, middle and last token
    count, for every type it serves."""
    top = rung.max_tokens or 40
    with cpu.use_native(True):
        for qtype in (NATIVE_TYPES if rung.native else ALL_TYPES):
            case = Case(qtype, 21, blocks=2)
            for tokens in sorted({1, top // 2 + 1, top}):
                x = case.randn(tokens, case.n_in)
                y = rung.kernel(x, case.packed, qtype, case.n_out, case.n_in, case.scales,
                                case.scale_2)
                err = rel_err(y, x.double() @ case.weight64().T)
                assert err < 1e-5, f"{rung.name} {case} tokens={tokens}: relative error {err:.3g}"


@pytest.mark.parametrize("qtype", [GGMLType.F16, GGMLType.BF16], ids=lambda t: t.name)
def test_float_rows_of_any_width(qtype):
    """F16/BF16 rows need not fill a vector: widths 16k + 1..15 on the native
    rungs (the fused kernel sums the last partial vector apart)."""
    seed = random.randrange(1 << 31)
    gen = torch.Generator().manual_seed(seed)
    with cpu.use_native(True):
        for n_in in (1, 7, 37, 263, 300):
            w = random_weight(qtype, 11, n_in, generator=gen)
            ref = w.dequantize().double()
            for tokens in (1, 3, 8, 9, 20):
                assert cpu.rung_for(qtype, tokens).native
                x = torch.randn(tokens, n_in, generator=gen)
                err = rel_err(ops.qmatmul(x, *w.op_args()), x.double() @ ref.T)
                assert err < 1e-5, (f"{qtype.name} n_in={n_in} tokens={tokens} seed {seed}: "
                                    f"relative error {err:.3g}")


def test_native_and_torch_paths_agree_closely():
    """The two CPU paths sum in different orders; both sit within 1e-5 of the
    reference, so within 2e-5 of each other."""
    case = Case(GGMLType.Q5_K, 29, blocks=4)
    x = case.randn(3, case.n_in)
    with cpu.use_native(True):
        a = ops.qmatmul(x, *case.args)
    with cpu.use_native(False):
        b = ops.qmatmul(x, *case.args)
    assert rel_err(a, b.double()) < 2e-5, str(case)
    assert not torch.equal(a, torch.zeros_like(a))


def _forked_child(args, x, conn):
    conn.send(ops.qmatmul(x, *args).tolist())   # plain data: no shared-memory handles


def test_thread_pool_concurrent_callers_and_fork():
    """Python threads calling at once (one runs the pool, others run inline)
    and a forked child (no helpers) all get the reference result."""
    import multiprocessing as mp
    import threading

    case = Case(GGMLType.Q4_K, 301, blocks=4)
    x = case.randn(2, case.n_in)
    ref = x.double() @ case.weight64().T
    threads_before = torch.get_num_threads()
    torch.set_num_threads(max(2, threads_before))
    old_min = cpu.THREAD_MIN_BYTES
    cpu.THREAD_MIN_BYTES = 1          # use every thread even on this small matrix
    try:
        with cpu.use_native(True):
            errors: list[str] = []

            def work():
                for _ in range(20):
                    err = rel_err(ops.qmatmul(x, *case.args), ref)
                    if not err < 1e-5:
                        errors.append(f"{err:.3g}")

            ts = [threading.Thread(target=work) for _ in range(3)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=120)
            assert not any(t.is_alive() for t in ts), f"{case}: a caller hung"
            assert not errors, f"{case}: concurrent callers got relative errors {errors}"

            ctx = mp.get_context("fork")
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_forked_child, args=(case.args, x, child))
            p.start()
            assert parent.poll(120), f"{case}: the forked child hung"
            y = torch.tensor(parent.recv())
            p.join(timeout=30)
            assert rel_err(y, ref) < 1e-5, f"{case}: forked child got a wrong result"
    finally:
        cpu.THREAD_MIN_BYTES = old_min
        torch.set_num_threads(threads_before)


@pytest.mark.parametrize("tokens", [1, 2, 5, 8, 13])
def test_bits_do_not_depend_on_threads(tokens):
    """Each output row is summed by one thread in a fixed order, so the bits
    depend on the token count only, never on the thread count or the call."""
    case = Case(GGMLType.Q6_K, 97, blocks=2)
    x = case.randn(tokens, case.n_in)
    threads_before, old_min = torch.get_num_threads(), cpu.THREAD_MIN_BYTES
    try:
        cpu.THREAD_MIN_BYTES = 1
        with cpu.use_native(True):
            torch.set_num_threads(1)
            one = ops.qmatmul(x, *case.args)
            torch.set_num_threads(3)
            many = [ops.qmatmul(x, *case.args) for _ in range(3)]
    finally:
        cpu.THREAD_MIN_BYTES = old_min
        torch.set_num_threads(threads_before)
    for y in many:
        assert torch.equal(y, one), f"{case} tokens={tokens}: bits changed with the thread count"
    assert rel_err(one, x.double() @ case.weight64().T) < 1e-5, str(case)


@x86_only
@pytest.mark.parametrize("march, needs", OTHER_MARCHES)
def test_other_instruction_sets(march, needs, monkeypatch):
    """This machine builds -march=native (AVX-512 where present); rebuild for
    AVX2 and for plain x86-64 so their decoders and GEMM widths are checked
    against float64 too, fused (1..8 tokens) and GEMM (9+) alike, and their
    dequantize bit for bit."""
    with native_build_for(march, needs, monkeypatch):
        with cpu.use_native(True):
            for qtype in NATIVE_TYPES:
                case = Case(qtype, 13, blocks=2)
                for tokens in (1, 3, 8, 9, 17, 40):
                    x = case.randn(tokens, case.n_in)
                    err = rel_err(ops.qmatmul(x, *case.args), x.double() @ case.weight64().T)
                    assert err < 1e-5, f"-march={march} {case} tokens={tokens}: relative error {err:.3g}"
                dq = ops.dequantize(*case.args)              # the decoders, bit for bit
                assert torch.equal(dq.double(), case.weight64()), f"-march={march} {case}: dequantize"
