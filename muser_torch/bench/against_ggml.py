"""``muser-torch bench ops --device cpu --against ggml``: ``muser::qmatmul_ggml``
(and ``muser::qmatmul``, the exact mode) against ggml's own ``mul_mat`` on the
same bytes, the same activations and the same thread count, interleaved.

For every type llama.cpp's files use (or Gemma 3 270M's small shapes) and
each token count it prints the median time of each contender over rounds that call them in turn (so a slow
spell on a shared machine hits both), the ratio muser / ggml (<= 1.0: muser is
as fast or faster), and at one token muser's GB/s of packed bytes and its
fraction of the read bandwidth measured in the same run. It says which ggml
build it ran (libggml-python's AVX2 build unless ``--ggml-lib`` names another
folder holding ``libggml-base.so`` and ``libggml-cpu.so``). Nothing is asserted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from ..formats import random_weight
from ..formats.types import GGMLType

# One large shape per type (llama.cpp's 7-8B FFN: 4096 x 14336) and the
# K-quants also at three of Muse Glimmer's benchmark shapes (docs/muse-glimmer.md).
@dataclass(frozen=True)
class Case:
    qtype: GGMLType
    n_in: int
    n_out: int


LEGACY_AND_FLOAT = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                    GGMLType.F16, GGMLType.BF16)
K_QUANTS = (GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.Q2_K, GGMLType.Q3_K)
LOOKUP = (GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4)
GRID = (GGMLType.IQ3_XXS, GGMLType.IQ3_S)
CASES = tuple(Case(t, 4096, 14336) for t in LEGACY_AND_FLOAT) + tuple(
    Case(t, n_in, n_out) for t in K_QUANTS for n_in, n_out in ((6656, 4096), (6656, 19968), (19968, 6656))
) + tuple(Case(t, 4096, 14336) for t in LOOKUP + GRID)
TOKENS = (1, 2, 4, 8, 128)
# Gemma 3 270M's projections (Q4_K_M file): rows of 640, 1024 and 2048, where a
# call's fixed cost is a large part of its time at one token.
GEMMA3_270M = (Case(GGMLType.Q5_0, 640, 256), Case(GGMLType.Q8_0, 640, 256),
               Case(GGMLType.Q5_0, 640, 2048), Case(GGMLType.Q4_K, 1024, 640),
               Case(GGMLType.Q6_K, 2048, 640))
# A 640->8 weight: its kernel takes about a microsecond, so a call's time is its fixed cost.
CALL_COST = (Case(GGMLType.Q8_0, 640, 8),)
CASE_SETS = {"large": CASES, "gemma3-270m": GEMMA3_270M, "call-cost": CALL_COST}


def _interleaved(fns: dict, rounds: int, min_s: float) -> dict:
    """Median seconds per call of each fn, called in turn for ``rounds`` rounds
    (more while the total is under ``min_s``), after one warm-up call each."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    start = time.perf_counter()
    n = 0
    order = list(fns)
    while n < rounds or (time.perf_counter() - start < min_s and n < 20 * rounds):
        # each round starts with the next contender: none always follows ggml,
        # whose pool threads spin for a while after a call
        for k in order[n % len(order):] + order[:n % len(order)]:
            t = time.perf_counter()
            fns[k]()
            times[k].append(time.perf_counter() - t)
        n += 1
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def run(threads: int, tokens: tuple[int, ...], types: tuple[str, ...] | None, lib_dir: str | None,
        rounds: int, seed: int, read_bandwidth, cases: tuple[Case, ...] = CASES) -> list[dict]:
    """Print the table and return its rows. ``read_bandwidth(device)`` is
    bench/ops's measurement, passed in by its caller (bench/ops imports this
    module, so this module does not import it)."""
    from ..nn import QLinear
    from . import ggml_mulmat

    dll = ggml_mulmat.load(lib_dir)
    if dll is None:
        raise ValueError("bench ops --against ggml: no ggml library (pip install libggml-python, "
                         "or --ggml-lib DIR with libggml-base.so and libggml-cpu.so)")
    torch.set_num_threads(threads)
    cases = cases if not types else tuple(c for c in cases if c.qtype.name in types)
    bw = read_bandwidth(torch.device("cpu"))
    print(f"ggml: {ggml_mulmat.describe(dll)}; {threads} threads each; read bandwidth "
          f"{bw / 1e9:.1f} GB/s (sum over 512 MiB); muser: QLinear modules (what a model calls: "
          f"'muser' the ggml numerics, 'exact' the float one), 'op' torch.ops.muser.qmatmul_ggml "
          f"through the dispatcher; median of >= {rounds} interleaved rounds")
    print(f"{'type':<6} {'n_in->n_out':>12} {'tok':>4} {'MB':>6} {'ggml us':>9} {'muser us':>9} "
          f"{'ratio':>6} {'exact us':>9} {'ratio':>6} {'op us':>9} {'GB/s':>6} {'of bw':>6}")
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for c in cases:
        w = random_weight(c.qtype, c.n_out, c.n_in, generator=gen)
        exact = QLinear.from_weight(w)
        ggml_mode = QLinear.from_weight(w)
        ggml_mode.numerics = "ggml"
        mb = w.packed.numel() / 1e6
        for t in tokens:
            x = torch.randn(t, c.n_in, generator=gen)
            mm = ggml_mulmat.MulMat(dll, w.packed, c.qtype, c.n_out, c.n_in, t, threads)
            mm.set_x(x)
            args = (w.packed, int(c.qtype), c.n_out, c.n_in)
            with torch.no_grad():
                med = _interleaved({"ggml": mm.compute, "muser": lambda: ggml_mode(x),
                                    "exact": lambda: exact(x),
                                    "op": lambda: torch.ops.muser.qmatmul_ggml(x, *args)},
                                   rounds, min_s=0.5)
            mm.close()
            gbps = w.packed.numel() / med["muser"] / 1e9
            rows.append({"type": c.qtype.name, "n_in": c.n_in, "n_out": c.n_out, "tokens": t,
                         "ggml_s": med["ggml"], "muser_s": med["muser"], "exact_s": med["exact"],
                         "op_s": med["op"]})
            print(f"{c.qtype.name:<6} {f'{c.n_in}->{c.n_out}':>12} {t:>4} {mb:>6.1f} "
                  f"{med['ggml'] * 1e6:>9.1f} {med['muser'] * 1e6:>9.1f} "
                  f"{med['muser'] / med['ggml']:>6.2f} {med['exact'] * 1e6:>9.1f} "
                  f"{med['exact'] / med['ggml']:>6.2f} {med['op'] * 1e6:>9.1f} "
                  f"{gbps:>6.1f} {gbps * 1e9 / bw:>6.1%}", flush=True)
    return rows
