"""The CUDA kernels beside llama.cpp's, and the launch sweeps that pick the
ladder's parameters (sections of ``muser-torch bench triton``).

  peer      test-backend-ops' shape (m=4096, k=14336: ``n_out`` 4096, ``n_in``
            14336) for every type the CUDA backend runs, at 1, 2, 4, 8 and 512
            tokens (and 16, which llama.cpp's perf cases lack): the dispatched
            rung, the other kernels that could run the call, and llama.cpp's own
            ``test-backend-ops perf -o MUL_MAT`` µs per call, run by this section
            in the same process (``--test-backend-ops BINARY``; tools/cuda_bench.sh
            lcpp-build builds it).
  i8sweep   launch parameters (BN, warps, split target) of the ``i8_dot``
            rung at 1 and 8 tokens, per type.
  qmmsweep  tile shapes of the tensor-core rung at 512 tokens, per type.

Each time is a CUDA-graph replay over rotating weight copies
(``cuda_timing.graph_time``), float16 activations; printed, never asserted.
test-backend-ops times one weight copy, which its kernels may find in the L2 (a
4096 x 14336 Q4_K matrix is 33 MB, the H100's and H200's L2 50 MB), so ``peer``
also times the dispatched rung on one copy, and its ratio to llama.cpp is that
like-for-like time's.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import torch

from ..formats.types import GGMLType
from .cuda_timing import graph_time
from .ops import Shape

T = GGMLType
PEER_TOKENS = (1, 2, 4, 8, 16, 512)
PEER_M, PEER_K = 4096, 14336             # test-backend-ops' perf shape (rows, columns)
_PERF_LINE = re.compile(r"MUL_MAT\(type_a=(\w+),type_b=f32,m=(\d+),n=(\d+),k=(\d+),[^)]*\):"
                        r"\s+(\d+) runs -\s+([\d.]+) us/run")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def peer_types() -> tuple[GGMLType, ...]:
    """Every type the CUDA backend runs, but the float ones (not quantized kernels)."""
    from ..ops import cuda
    return tuple(sorted(t for t in cuda.SUPPORTED if t not in (T.F32, T.F16, T.BF16)))


def ggml_name(qt: GGMLType) -> str:
    """ggml's name of a type (``q4_K``, ``iq4_xs``), as test-backend-ops prints it."""
    return qt.name.lower().replace("_k", "_K")


def parse_mulmat_perf(text: str) -> dict[tuple[str, int], float]:
    """test-backend-ops perf's MUL_MAT lines at (PEER_M, PEER_K): µs per call by
    (ggml type name, n)."""
    out = {}
    for line in _ANSI.sub("", text).splitlines():
        m = _PERF_LINE.search(line)
        if m and int(m.group(2)) == PEER_M and int(m.group(4)) == PEER_K:
            out[(m.group(1), int(m.group(3)))] = float(m.group(6))
    return out


def llama_cpp_mulmat(binary: str | Path, types, timeout: float = 900) -> dict[tuple[str, int], float]:
    """Run llama.cpp's ``test-backend-ops perf -o MUL_MAT -b CUDA0`` for ``types`` at its
    perf shape and return µs per call by (ggml type name, n)."""
    binary = Path(binary)
    if not binary.is_file():
        raise FileNotFoundError(f"--test-backend-ops: no such file {binary} (tools/cuda_bench.sh lcpp-build "
                                f"builds it into /root/lcpp-build/bin)")
    names = "|".join(ggml_name(t) for t in types)
    regex = f"type_a=({names}),type_b=f32,m={PEER_M},n=[0-9]+,k={PEER_K},"
    run = subprocess.run([str(binary), "perf", "-o", "MUL_MAT", "-b", "CUDA0", "-p", regex],
                         capture_output=True, text=True, timeout=timeout)
    found = parse_mulmat_perf(run.stdout)
    if not found:
        raise RuntimeError(f"{binary.name} printed no MUL_MAT timings (exit {run.returncode}): "
                           f"{(run.stderr or run.stdout)[-300:]}")
    return found


I8_SWEEP = ((16, 1), (16, 2), (32, 2), (64, 4), (128, 4))
I8_PER_SM = (4, 8)
QMM_SWEEP = ((64, 64, 8), (128, 64, 8), (64, 128, 8), (128, 128, 8), (128, 64, 4))


def _time(fn_of_args, args) -> float:
    return graph_time([lambda a=a: fn_of_args(a) for a in args], reps=10) * 1e6


def bench_peer(weights, bw, gen, tokens=PEER_TOKENS, test_backend_ops: str | None = None):
    """``weights(shape) -> (w, nbytes, args)`` as ``triton_kernels._weights``; llama.cpp's
    figures come from running ``test_backend_ops`` here, first (its own process)."""
    from ..ops import cuda
    if test_backend_ops is None:
        raise ValueError("bench triton --what peer needs --test-backend-ops BINARY (llama.cpp's, built "
                         "by tools/cuda_bench.sh lcpp-build): its figures are measured in the same run")
    types = peer_types()
    lcpp = llama_cpp_mulmat(test_backend_ops, types)
    print(f"peer: llama.cpp's test-backend-ops measured {len(lcpp)} MUL_MAT cases at m={PEER_M} "
          f"k={PEER_K} ({Path(test_backend_ops).name}, one weight copy)", flush=True)
    rows = []
    for qt in types:
        shape = Shape("tbo 4096x14336", qt, PEER_K, PEER_M)
        w, nbytes, args = weights(shape, gen)
        one = None
        for n in tokens:
            x = torch.randn(n, shape.n_in, device="cuda", dtype=torch.float16, generator=gen)
            us = _time(lambda a: cuda.qmatmul(x, *a), args)
            same = _time(lambda a: cuda.qmatmul(x, *a), args[:1] * len(args))   # one copy, as tbo
            one = us if n == 1 else one
            lc = lcpp.get((ggml_name(qt), n))
            r = dict(qtype=qt.name, tokens=n, rung=cuda.rung_for(qt, n, x.dtype).name, us=us,
                     of_bw=nbytes / (us * 1e-6) / bw, over_one=us / one, one_copy_us=same,
                     llama_cpp_us=lc)
            for name, alt in _alternatives(cuda, qt, n).items():
                r[f"alt_{name}_us"] = _time(lambda a: alt(x, a, shape), args)
            rows.append(r)
            ratio = f"{same / lc:5.2f}" if lc else "    –"
            lcs = f"{lc:7.1f}" if lc else "      –"
            extra = "".join(f"  {k[4:-3]} {v:.1f}" for k, v in r.items() if k.startswith("alt_"))
            print(f"peer {qt.name:<10} n={n:<4} {r['rung']:<10} {us:9.1f} µs {r['of_bw']:6.1%} "
                  f"({us / one:4.2f}x n=1)  one copy {same:9.1f} µs  llama.cpp {lcs} µs (one copy)  "
                  f"muser/llama.cpp {ratio}{extra}", flush=True)
        del args, w
        torch.cuda.empty_cache()
    return rows


def _alternatives(cuda, qt, n):
    """The other kernels that could run ``n`` tokens of ``qt``: the float32 rung and
    the int8-dot kernel at one token, the BM=16 tensor-core tile and the int8-dot
    kernel at 2-8 (launches as the i8 sweep found best)."""
    def i8(launch):
        return lambda x, a, s: cuda._i8_dot(x, a[0], qt, s.n_out, s.n_in, None, None, launch)

    def rung(name):
        return lambda x, a, s: cuda.run_rung(name, x, a[0], qt, s.n_out, s.n_in, a[4], a[5])
    if qt not in cuda.I8_TYPES or n > 8:
        return {}
    kq = qt in (T.Q4_K, T.Q5_K)
    if n == 1:
        return {"float": rung("mv_kquant" if qt in cuda.RUNGS["mv_kquant"].types else "mv_tile"),
                "i8": i8(cuda.Launch(64, 4, 4) if kq else cuda.Launch(16, 1, 4))}
    return {"qmm_small": rung("qmm_small"),
            "i8": i8(cuda.Launch(32, 2, 4) if kq else cuda.Launch(16, 2, 4))}


def bench_i8_sweep(weights, bw, gen, tokens=(1, 8), shapes=None):
    from ..ops import cuda
    best = {}
    shapes = shapes or [Shape("tbo 4096x14336", qt, PEER_K, PEER_M) for qt in peer_types()
                        if qt in cuda.I8_TYPES]
    for shape in shapes:
        qt = shape.qtype
        w, nbytes, args = weights(shape, gen)
        for n in tokens:
            x = torch.randn(n, shape.n_in, device="cuda", dtype=torch.float16, generator=gen)
            res = []
            for bn, warps in I8_SWEEP:
                for per_sm in I8_PER_SM:
                    try:
                        us = _time(lambda a: cuda.run_rung("i8_dot", x, a[0], qt, shape.n_out,
                                                           shape.n_in, bn=bn, warps=warps,
                                                           per_sm=per_sm), args)
                    except Exception as e:  # noqa: BLE001 (report and go on)
                        print(f"  i8 {qt.name} n={n} {bn}/{warps}/{per_sm}: {e!r}"[:300])
                        continue
                    res.append((us, bn, warps, per_sm))
            res.sort()
            best[f"{shape.label} {qt.name} {n}"] = [dict(us=u, bn=b, warps=wp, per_sm=s,
                                                         of_bw=nbytes / (u * 1e-6) / bw)
                                                    for u, b, wp, s in res]
            top = ", ".join(f"{b}/{wp}/{s}:{u:.1f}µs({nbytes / (u * 1e-6) / bw:.0%})"
                            for u, b, wp, s in res[:4])
            print(f"i8sweep {shape.label} {qt.name:<5} n={n}: {top}", flush=True)
        del args, w
        torch.cuda.empty_cache()
    return best


def bench_qmm_sweep(weights, bw, gen, tokens=512):
    from ..ops import cuda
    best = {}
    for qt in peer_types():
        shape = Shape("tbo 4096x14336", qt, PEER_K, PEER_M)
        w, nbytes, args = weights(shape, gen)
        x = torch.randn(tokens, shape.n_in, device="cuda", dtype=torch.float16, generator=gen)
        res = []
        for bm, bn, warps in QMM_SWEEP:
            try:
                us = _time(lambda a: cuda.run_rung("qmm_tiled", x, a[0], qt, shape.n_out,
                                                   shape.n_in, a[4], a[5], bm=bm, bn=bn,
                                                   warps=warps), args[:2])
            except Exception as e:  # noqa: BLE001
                print(f"  qmm {qt.name} {bm}/{bn}/{warps}: {e!r}"[:300])
                continue
            res.append((us, bm, bn, warps))
        res.sort()
        best[qt.name] = [dict(us=u, bm=m, bn=b, warps=wp) for u, m, b, wp in res]
        print(f"qmmsweep {qt.name:<5} n={tokens}: " + ", ".join(
            f"{m}x{b}/{wp}:{u:.0f}µs" for u, m, b, wp in res), flush=True)
        del args, w
        torch.cuda.empty_cache()
    return best
