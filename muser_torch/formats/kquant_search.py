"""The scale searches behind ggml's quantizers, vectorized across blocks.

Ports of ggml-quants.c's ``make_qkx2_quants`` / ``make_qkx3_quants`` (one
function: they differ only in their arguments), ``make_qx_quants`` (with
``rmse_type == 1``), ``make_q3_quants`` (with ``do_rmse``) and ``make_qp_quants``. The results must be
byte-identical to ggml, so the float32 arithmetic follows ggml's order:

* Every sum over the elements of a group is accumulated one element after
  another, as ggml's loops do. Tensors here are position-major (``[n, ...]``,
  element i of every group in row i), so each step of such a sum is one
  vectorized add across all groups and search candidates. ``Tensor.sum``
  would add pairwise and round differently.
* Products are evaluated left to right as written in C (``w*l*x`` is
  ``(w*l)*x``); nothing is fused or reassociated.
* ggml's ``nearest_int`` adds 1.5 * 2**23 and reads the mantissa, which is
  round-half-to-even for |v| < 2**22; the searches use ``torch.round``, the
  same rounding, as their arguments are bounded by the code range. The
  final roundings, which can see overflowed scales, use :func:`nearest_int`.
* Divisions with a constant numerator go through :func:`rdiv`, by a
  constant that is not a power of two through :func:`div_rn`, and square
  roots through :func:`sqrt_rn`; torch's own ``c / t``, CUDA's ``t / c`` and
  float32 ``sqrt`` round differently from C.
* ggml's scans over candidates are sequential where they must be:
  make_qkx*_quants forms each candidate from the running min, and
  make_qx_quants compares against a running best. Where ggml only keeps the
  first best of a scan with a strict ``<`` (make_qp_quants), a vectorized
  ``argmin`` (first index on ties) picks the same candidate.

Group-major inputs (``[N, n]``) come in and go out; the transposes are
internal.
"""
from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Iterable, TypeVar

import numpy as np
import torch

T = TypeVar("T")

GROUP_MAX_EPS = 1e-15  # ggml's "all zero" threshold for a group's max


def run_chunks(fn: Callable[[int], T], starts: Iterable[int], device: torch.device) -> list[T]:
    """``[fn(s) for s in starts]``, on CPU spread over torch's threads.

    The searches issue thousands of small ops per chunk. Letting each op
    fork and join torch's intra-op threads costs more than it saves, and on
    a loaded machine one descheduled worker stalls every op (measured: 30x
    slower on 2 busy cores). So each chunk runs single-threaded and the
    chunks run side by side in Python threads (torch releases the GIL inside
    ops). Results are independent of the thread count."""
    starts = list(starts)
    if device.type != "cpu":
        return [fn(s) for s in starts]
    workers = min(torch.get_num_threads(), len(starts))
    if workers <= 1:
        with _intra_op_threads(1):
            return [fn(s) for s in starts]
    with _intra_op_threads(1), ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, starts))


@contextlib.contextmanager
def _intra_op_threads(n: int):
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def rdiv(a: float, t: torch.Tensor) -> torch.Tensor:
    """float32 ``a / t`` correctly rounded, as C's ``a / t``.

    ``a / t`` on a tensor computes ``t.reciprocal() * a``, which rounds twice
    and differs from C in about a quarter of cases."""
    return torch.full_like(t, float(a)).div_(t)


def div_rn(t: torch.Tensor, c: float) -> torch.Tensor:
    """float32 ``t / c`` for a constant ``c``, correctly rounded on every
    device, as C's ``t / c``. CUDA computes ``t / c`` as ``t * (1 / c)``,
    which is off by an ulp for some ``t`` unless ``c`` is a power of two."""
    return t / t.new_full((), float(c))


def sqrt_rn(t: torch.Tensor) -> torch.Tensor:
    """float32 square root, correctly rounded like C's ``sqrtf``.

    torch's float32 CPU ``sqrt`` is off by one ulp in about one case in six;
    the float64 root rounded to float32 is exact (53 >= 2*24 + 2 bits). MPS
    has no float64, and Metal's float32 ``sqrt`` is used as it is there."""
    if t.device.type == "mps":
        return torch.sqrt(t)
    return torch.sqrt(t.to(torch.float64)).to(torch.float32)


def nearest_int(v: torch.Tensor) -> torch.Tensor:
    """ggml's ``nearest_int`` bit for bit, as float32 values.

    Adds 1.5 * 2**23 and reads the low mantissa bits: round-half-even for
    |v| < 2**22 (where it equals ``torch.round``), and ggml's wrapped values
    beyond; inf and NaN come out as -2**22 and 0. The final rounding of a
    K-quant can see those when an f16 super-scale overflows, so it uses this;
    the searches, whose arguments stay within the code range, use round."""
    bits = (v + 12582912.0).view(torch.int32)
    return ((bits & 0x7FFFFF) - 0x400000).to(torch.float32)


def seq_sum(t: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
    """Sum ``t`` over dim 0 in index order, in float32, like a C loop.

    The accumulator starts at ``start`` (ggml's ``float s = 0`` when None)."""
    if start is None:
        acc = t[0] + 0.0          # 0 + t[0]: a -0 term sums to +0, as in C
        first = 1
    else:
        acc, first = start.clone(), 0
    for i in range(first, t.shape[0]):
        acc += t[i]
    return acc


def _candidate_factors(offset: float, step: float, count: int, base: int,
                       skip_zero: bool = False, first: int = 0) -> np.ndarray:
    """float32 ``base + offset + step*is`` for is = first..first+count-1, each
    operation rounded to float32 in C's order: ``(offset + step*is) + base``."""
    out = []
    for k in range(first, first + count):
        if skip_zero and k == 0:
            continue
        v = np.float32(np.float32(offset) + np.float32(np.float32(step) * np.float32(k)))
        out.append(np.float32(v + np.float32(base)))
    return np.array(out, dtype=np.float32)


def make_qkx_quants(x: torch.Tensor, w: torch.Tensor, nmax: int, rmin: float, rdelta: float,
                    nstep: int, use_mad: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric codes 0..nmax with a least-squares scale and min per group.

    ``x``, ``w``: float32 ``[N, n]`` values and their importance weights;
    ``use_mad``: candidates are judged by the weighted absolute error (Q2_K's
    reference path) instead of the weighted squared error.
    Returns (``L`` uint8 ``[N, n]``, ``scale`` ``[N]``, ``the_min`` ``[N]``),
    with y ~= scale * L - the_min. ggml's make_qkx2_quants / make_qkx3_quants.

    The candidates cannot be evaluated side by side: ggml's loop reads the
    running ``min`` when it forms the next candidate, and an accepted
    candidate replaces it. So this is a loop over the nstep + 1 candidates,
    each step vectorized over all groups.
    """
    xt = x.t().contiguous()                               # [n, N]
    wt = w.t().contiguous()
    n, groups = xt.shape
    mn = xt.amin(0)
    mn = torch.where(mn > 0, torch.zeros_like(mn), mn)
    mx = xt.amax(0)
    sum_w = seq_sum(wt[1:], wt[0])
    sum_x = seq_sum(wt[1:] * xt[1:], wt[0] * xt[0])
    flat = mx <= mn                                       # ggml: all codes 0, scale 0

    iscale = rdiv(nmax, mx - mn)
    scale = rdiv(1.0, iscale)
    codes = torch.round(iscale * (xt - mn)).clamp_(0, nmax)
    diff = scale * codes + mn - xt
    best_err = seq_sum(wt * (diff.abs() if use_mad else diff * diff))

    # State per group: the running min, and the (inverse scale, min) that
    # produced the codes kept so far; the codes themselves are rebuilt once
    # at the end instead of being copied at every accepted step.
    vmin, kept_iscale, kept_min = mn, iscale, mn
    xm = torch.sub(xt, mn)
    lc = torch.empty_like(xt)
    err_terms = torch.empty_like(xt)
    sq = torch.empty_like(xt)
    prods = torch.empty((n, 3, groups), dtype=xt.dtype, device=xt.device)
    sums = torch.empty((3, groups), dtype=xt.dtype, device=xt.device)
    err = torch.empty(groups, dtype=xt.dtype, device=xt.device)
    # Row views made once: the sequential sums below touch them 32 times a step.
    prod_rows, sq_rows = prods.unbind(0), sq.unbind(0)
    for factor in _candidate_factors(rmin, rdelta, nstep + 1, nmax):
        cand = rdiv(factor, mx - vmin)
        torch.mul(xm, cand, out=lc)
        lc.round_().clamp_(0, nmax)
        torch.mul(wt, lc, out=prods[:, 0])                # w*l
        torch.mul(prods[:, 0], lc, out=prods[:, 1])       # w*l*l
        torch.mul(prods[:, 0], xt, out=prods[:, 2])       # w*l*x
        _sum_rows(prod_rows, sums)
        sum_l, sum_l2, sum_xl = sums
        det = sum_w * sum_l2 - sum_l * sum_l
        this_scale = (sum_w * sum_xl - sum_x * sum_l) / det
        this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det
        clip = this_min > 0
        this_scale = torch.where(clip, sum_xl / sum_l2, this_scale)
        this_min = torch.where(clip, torch.zeros_like(this_min), this_min)
        torch.mul(lc, this_scale, out=err_terms)
        err_terms.add_(this_min).sub_(xt)
        if use_mad:
            torch.abs(err_terms, out=sq).mul_(wt)
        else:
            torch.mul(err_terms, err_terms, out=sq).mul_(wt)
        _sum_rows(sq_rows, err)
        take = (det > 0) & (err < best_err)
        best_err = torch.where(take, err, best_err)
        scale = torch.where(take, this_scale, scale)
        kept_iscale = torch.where(take, cand, kept_iscale)
        kept_min = torch.where(take, vmin, kept_min)
        vmin = torch.where(take, this_min, vmin)
        torch.sub(xt, vmin, out=xm)

    codes = torch.round(kept_iscale * (xt - kept_min)).clamp_(0, nmax)
    codes = torch.where(flat, torch.zeros_like(codes), codes)
    scale = torch.where(flat, torch.zeros_like(scale), scale)
    vmin = torch.where(flat, mn, vmin)
    return codes.t().to(torch.uint8).contiguous(), scale, -vmin


def _sum_rows(rows: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
    """``out = ((0 + rows[0]) + rows[1]) + ...``: :func:`seq_sum` into a buffer."""
    torch.add(rows[0], 0.0, out=out)
    for r in rows[1:]:
        out.add_(r)


def make_qx_quants(x: torch.Tensor, w: torch.Tensor | None,
                   nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric codes 0..2*nmax-1 (signed value + nmax) with one scale per group.

    ``x`` float32 ``[N, n]``; ``w`` importance weights, or None for ggml's
    ``x*x`` (``rmse_type == 1``). Returns (``L`` uint8 ``[N, n]``, ``scale``
    ``[N]``) with y ~= scale * (L - nmax). ggml's make_qx_quants.
    """
    xt = x.t().contiguous()
    wt = xt * xt if w is None else w.t().contiguous()
    n, groups = xt.shape
    # The signed value of largest magnitude; the first one on ties, as ggml's strict >.
    vmax = xt.gather(0, xt.abs().argmax(0, keepdim=True)).squeeze(0)
    zero = vmax.abs() < GROUP_MAX_EPS

    # Candidate 0 is ggml's first try (-nmax / max); the rest is its is = -9..9
    # loop, each accepted against the running best exactly as ggml compares.
    factors = np.concatenate([np.array([nmax], dtype=np.float32),
                              _candidate_factors(0.0, 0.1, 19, nmax, first=-9, skip_zero=True)])
    wx = wt * xt
    lc = torch.empty_like(xt)
    prods = torch.empty((n, 2, groups), dtype=xt.dtype, device=xt.device)
    sums = torch.empty((2, groups), dtype=xt.dtype, device=xt.device)
    rows = prods.unbind(0)
    for c, factor in enumerate(factors):
        cand = rdiv(-float(factor), vmax)
        torch.mul(xt, cand, out=lc)
        lc.round_().clamp_(-nmax, nmax - 1)
        torch.mul(wx, lc, out=prods[:, 0])                # w*x*l
        torch.mul(wt, lc, out=prods[:, 1]).mul_(lc)       # w*l*l
        _sum_rows(rows, sums)
        sumlx, suml2 = sums[0].clone(), sums[1].clone()
        if c == 0:
            scale = torch.where(suml2 != 0, sumlx / suml2, torch.zeros_like(sumlx))
            best = scale * sumlx
            kept = cand
            continue
        take = (suml2 > 0) & (sumlx * sumlx > best * suml2)
        new_scale = sumlx / suml2
        scale = torch.where(take, new_scale, scale)
        best = torch.where(take, new_scale * sumlx, best)
        kept = torch.where(take, cand, kept)
    codes = torch.mul(xt, kept).round_().clamp_(-nmax, nmax - 1) + nmax
    codes = torch.where(zero, torch.zeros_like(codes), codes)
    scale = torch.where(zero, torch.zeros_like(scale), scale)
    return codes.t().to(torch.uint8).contiguous(), scale


def make_qp_quants(x: torch.Tensor, w: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-negative codes 0..nmax for non-negative ``x`` ``[N, n]`` with
    weights ``w``; returns (``L`` uint8 ``[N, n]``, ``scale`` ``[N]``).

    ggml's make_qp_quants, used to quantize the sub-block scales and mins of
    Q4_K / Q5_K to 6 bits when an importance matrix is given. ggml stores
    codes in uint8, so a negative code (possible only for a negative input)
    wraps modulo 256; the emulation keeps that.
    """
    xt = x.t().contiguous()
    wt = w.t().contiguous()
    n, groups = xt.shape
    vmax = xt.amax(0).clamp(min=0.0)
    zero = vmax < GROUP_MAX_EPS

    iscale = rdiv(nmax, vmax)
    scale0 = rdiv(1.0, iscale)
    l0 = torch.remainder(torch.round(iscale * xt), 256)   # the stored uint8
    d = xt - scale0 * l0
    best_mse = seq_sum(wt * d * d)

    factors = torch.from_numpy(_candidate_factors(0.0, 0.1, 9, nmax, first=-4, skip_zero=True))
    cand = factors.to(x.device).view(-1, 1) / vmax        # [C, N]
    cand_scale = rdiv(1.0, cand)
    lc = torch.mul(cand, xt.unsqueeze(1)).round_().clamp_(max=nmax)
    d = xt.unsqueeze(1) - cand_scale * lc
    mse = seq_sum(wt.unsqueeze(1) * d * d)
    mse = torch.where(torch.isnan(mse), torch.full_like(mse, float("inf")), mse)
    best = mse.argmin(0, keepdim=True)
    take = mse.gather(0, best).squeeze(0) < best_mse
    iscale = torch.where(take, cand.gather(0, best).squeeze(0), iscale)

    lv = torch.round(iscale * xt).clamp_(max=nmax)        # the int l
    stored = torch.remainder(lv, 256)                     # L[i] as uint8
    sumlx = seq_sum(wt * xt * lv)
    suml2 = seq_sum(wt * lv * lv)
    # ggml's refinement: five passes, each visiting the elements in order and
    # moving one code when that raises sumlx^2 / suml2. A pass that changes
    # nothing leaves the state as it was, so running all five is equivalent
    # to ggml's early exit.
    for _ in range(5):
        for i in range(n):
            wi, xi, li = wt[i], xt[i], stored[i]
            slx = sumlx - wi * xi * li
            sl2 = suml2 - wi * li * li
            ok = (slx > 0) & (sl2 > 0)
            new_l = torch.round(xi * sl2 / slx).clamp_(max=nmax)
            ok &= new_l != li
            slx = slx + wi * xi * new_l
            sl2 = sl2 + wi * new_l * new_l
            ok &= slx * slx * suml2 > sumlx * sumlx * sl2
            stored[i] = torch.where(ok, torch.remainder(new_l, 256), li)
            sumlx = torch.where(ok, slx, sumlx)
            suml2 = torch.where(ok, sl2, suml2)
    scale = torch.where(suml2 > 0, sumlx / suml2, torch.zeros_like(sumlx))
    stored = torch.where(zero, torch.zeros_like(stored), stored)
    scale = torch.where(zero, torch.zeros_like(scale), scale)
    return stored.t().to(torch.uint8).contiguous(), scale


def make_q3_quants(x: torch.Tensor, nmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric codes 0..2*nmax-1 (signed value + nmax) with one scale per
    group, weights ``x*x``: ggml's make_q3_quants with ``do_rmse`` (Q3_K's
    reference path). ``x`` float32 ``[N, n]``; returns (``L`` uint8 ``[N, n]``,
    ``scale`` ``[N]``). An all-zero group gets codes 0 (not nmax) and scale 0,
    as in ggml.

    After the first rounding at ``-nmax / max``, five passes visit the
    elements in order and move one code when that raises sumlx^2 / suml2
    (a pass that changes nothing leaves the state as it was, so running all
    five equals ggml's early exit)."""
    xt = x.t().contiguous()
    n, groups = xt.shape
    vmax = xt.gather(0, xt.abs().argmax(0, keepdim=True)).squeeze(0)
    zero = vmax.abs() < GROUP_MAX_EPS
    iscale = rdiv(-float(nmax), vmax)
    lv = nearest_int(iscale * xt).clamp_(-nmax, nmax - 1)   # the signed int8 L
    wt = xt * xt
    wx = wt * xt
    sumlx = seq_sum(wx * lv)
    suml2 = seq_sum(wt * lv * lv)
    for _ in range(5):
        for i in range(n):
            wi, wxi, xi, li = wt[i], wx[i], xt[i], lv[i]
            slx = sumlx - wxi * li
            sl2 = suml2 - wi * li * li
            new_l = nearest_int(xi * sl2 / slx).clamp_(-nmax, nmax - 1)
            ok = (slx > 0) & (new_l != li)
            slx = slx + wxi * new_l
            sl2 = sl2 + wi * new_l * new_l
            ok &= (sl2 > 0) & (slx * slx * suml2 > sumlx * sumlx * sl2)
            lv[i] = torch.where(ok, new_l, li)
            sumlx = torch.where(ok, slx, sumlx)
            suml2 = torch.where(ok, sl2, suml2)
    scale = torch.where(suml2 > 0, sumlx / suml2, torch.zeros_like(sumlx))
    codes = torch.where(zero, torch.zeros_like(lv), lv + nmax)
    scale = torch.where(zero, torch.zeros_like(scale), scale)
    return codes.t().to(torch.uint8).contiguous(), scale
