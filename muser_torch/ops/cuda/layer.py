"""Triton kernels for the layer ops (``ops/layer.py``): the work between the
projections, one kernel each where the reference composite takes five to
fifteen small ones.

* ``_norm_kernel``: ``rms_norm`` in its three shapes (a norm; a residual add
  then a norm; a norm, a residual add, then a norm). One program per row.
* ``_norm_rope_kernel``: the per-head RMSNorm of q or k and RoPE (NeoX or
  llama.cpp's "normal" pairs) in one pass over each head's row.
* ``_attn_split_kernel`` + ``_attn_combine_kernel``: decode attention (one
  query position) over a KV ring, split over the keys (flash decoding): each
  program folds its chunk of keys into a running max, sum and weighted value
  sum; the combine kernel merges the chunks in order (deterministic).

Every kernel rounds where the reference rounds (a norm's output to the
activation dtype before the residual add, q and k to the cache's dtype
before their product), so a float32 model computes in IEEE float32
throughout and half models differ from the composite only by the order of
float32 sums.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _rms(v, D, eps):
    """1 / sqrt(mean(v^2) + eps) of a float32 row ``v`` (zeros past D)."""
    return 1.0 / tl.sqrt(tl.sum(v * v, 0) / D + eps)


@triton.jit
def _norm_kernel(a_ptr, r_ptr, wpost_ptr, w_ptr, h_ptr, y_ptr, D, eps_post, eps,
                 POST: tl.constexpr, RES: tl.constexpr, PRE: tl.constexpr,
                 BLOCK: tl.constexpr):
    """Row ``a``: POST: ``a = norm(a) * w_post`` (rounded to the dtype); RES:
    ``h = r + a`` (rounded; stored in h); PRE: ``y = norm(h) * w``."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    m = cols < D
    a = tl.load(a_ptr + row * D + cols, mask=m, other=0.0)
    dt = a.dtype
    v = a.to(tl.float32)
    if POST:
        wp = tl.load(wpost_ptr + cols, mask=m, other=0.0).to(tl.float32)
        v = (v * _rms(v, D, eps_post) * wp).to(dt).to(tl.float32)
    if RES:
        r = tl.load(r_ptr + row * D + cols, mask=m, other=0.0).to(tl.float32)
        v = (r + v).to(dt)
        tl.store(h_ptr + row * D + cols, v, mask=m)
        v = v.to(tl.float32)
    if PRE:
        w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * D + cols, (v * _rms(v, D, eps) * w).to(dt), mask=m)


@triton.jit
def _norm_rope_kernel(x_ptr, w_ptr, cos_ptr, sin_ptr, y_ptr, H, sbt, eps,
                      NORM: tl.constexpr, ROPE: tl.constexpr, NEOX: tl.constexpr,
                      HALF: tl.constexpr):
    """One head's row of x (head h of position bt at ``bt * sbt + h * D``): the
    RMSNorm (NORM), rounded to the dtype, then RoPE (ROPE) with ``cos/sin[B*T,
    HALF]`` of its position; into the contiguous ``y[B*T*H, D]``."""
    row = tl.program_id(0).to(tl.int64)
    src = (row // H) * sbt + (row % H) * (2 * HALF)
    j = tl.arange(0, HALF)
    D: tl.constexpr = 2 * HALF
    if NEOX:     # feature j pairs with j + D/2
        i1, i2 = j, j + HALF
    else:        # features 2j and 2j+1
        i1, i2 = 2 * j, 2 * j + 1
    x1 = tl.load(x_ptr + src + i1)
    dt = x1.dtype
    x1 = x1.to(tl.float32)
    x2 = tl.load(x_ptr + src + i2).to(tl.float32)
    if NORM:
        s = 1.0 / tl.sqrt((tl.sum(x1 * x1, 0) + tl.sum(x2 * x2, 0)) / D + eps)
        x1 = (x1 * s * tl.load(w_ptr + i1).to(tl.float32)).to(dt).to(tl.float32)
        x2 = (x2 * s * tl.load(w_ptr + i2).to(tl.float32)).to(dt).to(tl.float32)
    if ROPE:
        pos = row // H
        c = tl.load(cos_ptr + pos * HALF + j)
        sn = tl.load(sin_ptr + pos * HALF + j)
        x1, x2 = x1 * c - x2 * sn, x2 * c + x1 * sn
    tl.store(y_ptr + row * D + i1, x1.to(dt))
    tl.store(y_ptr + row * D + i2, x2.to(dt))


@triton.jit
def _attn_split_kernel(q_ptr, k_ptr, v_ptr, mask_ptr, valid_ptr, acc_ptr, ml_ptr,
                       n_kv, S, CHUNK, scale,
                       sqb, sqh, sqg, skb, sks, skh, svb, svs, svh, smb, smg, sms,
                       G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                       HAS_VALID: tl.constexpr, IEEE: tl.constexpr):
    """Program (b*n_kv + h, c): the G query rows of KV head h of batch row b
    against keys ``[c*CHUNK, (c+1)*CHUNK)``; writes the unnormalised value sum
    ``acc[bh, c, G, D]`` and (max, sum) ``ml[bh, c, 2, G]``."""
    bh = tl.program_id(0)
    c = tl.program_id(1)
    b = bh // n_kv
    h = bh % n_kv
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    gm = g < G
    q = tl.load(q_ptr + b * sqb + h * sqh + g[:, None] * sqg + d[None, :], mask=gm[:, None],
                other=0.0)
    start = c * CHUNK
    stop = tl.minimum(start + CHUNK, S)
    if HAS_VALID:       # ring entries at or past the valid count are empty: skip them
        stop = tl.minimum(stop, tl.load(valid_ptr + b))
    m_i = tl.full((GP,), -1.0e30, tl.float32)
    l_i = tl.zeros((GP,), tl.float32)
    acc = tl.zeros((GP, D), tl.float32)
    for s0 in range(start, stop, BS):
        s = s0 + tl.arange(0, BS)
        sm = s < stop
        k = tl.load(k_ptr + b * skb + s[:, None] * sks + h * skh + d[None, :], mask=sm[:, None],
                    other=0.0)
        if IEEE:
            qk = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            qk = tl.dot(q, tl.trans(k))
        keep = tl.load(mask_ptr + b * smb + g[:, None] * smg + s[None, :] * sms,
                       mask=gm[:, None] & sm[None, :], other=0) != 0
        qk = tl.where(keep, qk * scale, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(qk - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptr + b * svb + s[:, None] * svs + h * svh + d[None, :], mask=sm[:, None],
                    other=0.0)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    n_chunks = tl.num_programs(1)
    base = bh * n_chunks + c
    tl.store(acc_ptr + (base * GP + g[:, None]) * D + d[None, :], acc)
    tl.store(ml_ptr + (base * 2) * GP + g, m_i)
    tl.store(ml_ptr + (base * 2 + 1) * GP + g, l_i)


@triton.jit
def _attn_combine_kernel(acc_ptr, ml_ptr, o_ptr, n_chunks, sob, soh, sog, n_kv,
                         G: tl.constexpr, GP: tl.constexpr, D: tl.constexpr):
    """Merge the chunks of program ``bh`` in chunk order: ``o = sum(acc_c *
    exp(m_c - M)) / sum(l_c * exp(m_c - M))``."""
    bh = tl.program_id(0)
    b = bh // n_kv
    h = bh % n_kv
    g = tl.arange(0, GP)
    d = tl.arange(0, D)
    m_all = tl.full((GP,), -1.0e30, tl.float32)
    for c in range(0, n_chunks):
        m_all = tl.maximum(m_all, tl.load(ml_ptr + ((bh * n_chunks + c) * 2) * GP + g))
    num = tl.zeros((GP, D), tl.float32)
    den = tl.zeros((GP,), tl.float32)
    for c in range(0, n_chunks):
        base = bh * n_chunks + c
        w = tl.exp(tl.load(ml_ptr + (base * 2) * GP + g) - m_all)
        den += tl.load(ml_ptr + (base * 2 + 1) * GP + g) * w
        num += tl.load(acc_ptr + (base * GP + g[:, None]) * D + d[None, :]) * w[:, None]
    out = num / den[:, None]
    tl.store(o_ptr + b * sob + h * soh + g[:, None] * sog + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=(g < G)[:, None])


@triton.jit
def _kv_store_kernel(k_ptr, v_ptr, ck_ptr, cv_ptr, slots_ptr, pos_ptr, T, m, n_kv, cap, D,
                     sk, sv, BLOCK: tl.constexpr):
    """Row (b, t, h) of the last ``m`` new keys/values: into entry ``pos % cap``
    of slot ``slots[b]``, in the cache's dtype."""
    r = tl.program_id(0)
    h = r % n_kv
    t = T - m + (r // n_kv) % m
    b = r // (n_kv * m)
    e = tl.load(pos_ptr + b * T + t) % cap
    slot = tl.load(slots_ptr + b)
    d = tl.arange(0, BLOCK)
    dm = d < D
    bt = (b * T + t).to(tl.int64)
    dst = ((slot * cap + e) * n_kv + h) * D + d
    tl.store(ck_ptr + dst, tl.load(k_ptr + bt * sk + h * D + d, mask=dm).to(ck_ptr.dtype.element_ty),
             mask=dm)
    tl.store(cv_ptr + dst, tl.load(v_ptr + bt * sv + h * D + d, mask=dm).to(cv_ptr.dtype.element_ty),
             mask=dm)


@triton.jit
def _gated_act_kernel(g_ptr, u_ptr, y_ptr, n, sg, su, ACT: tl.constexpr, BLOCK: tl.constexpr):
    """``act(g) * u`` over rows of ``n`` (rows ``sg`` / ``su`` apart in g and u,
    contiguous in y), ``act`` rounded to the dtype first (as the composite)."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    g0 = tl.load(g_ptr + row * sg + i, mask=m, other=0.0)
    g = g0.to(tl.float32)
    if ACT == 0:      # SiLU
        a = g / (1.0 + tl.exp(-g))
    elif ACT == 1:    # GELU, tanh approximation: tanh(z) = 1 - 2 / (exp(2z) + 1)
        z = 0.7978845608028654 * (g + 0.044715 * g * g * g)
        a = 0.5 * g * (2.0 - 2.0 / (tl.exp(2.0 * z) + 1.0))
    else:             # sigmoid
        a = 1.0 / (1.0 + tl.exp(-g))
    a = a.to(g0.dtype).to(tl.float32)
    u = tl.load(u_ptr + row * su + i, mask=m, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * n + i, (a * u).to(g0.dtype), mask=m)


@triton.jit
def _decode_mask_kernel(len_ptr, keep_ptr, valid_ptr, cap, window, BLOCK: tl.constexpr):
    """Row b: entry i holds position ``i + cap * ((last - i) // cap)`` when
    ``i <= last`` (the new token's position); kept within the window."""
    b = tl.program_id(0)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    last = tl.load(len_ptr + b)
    pos = i + cap * ((last - i) // cap)       # last - i >= 0 wherever it is used
    keep = i <= last
    if window > 0:
        keep = keep & (last - pos < window)
    tl.store(keep_ptr + b * cap + i, keep.to(tl.int8), mask=i < cap)
    if tl.program_id(1) == 0:
        tl.store(valid_ptr + b, tl.minimum(last + 1, cap))


# ---- launchers (the layer ops' CUDA kernels, in schema order) -----------------------------

import torch  # noqa: E402

from ..layer import REFERENCES  # noqa: E402

_ATTN_BS = 64            # keys per inner step of a decode-attention program
_ATTN_PROGRAMS = 264     # about two programs per SM on an H200 (132 SMs)


def _norm_warps(D: int) -> int:
    return 8 if D >= 4096 else 4 if D >= 1024 else 2


def _rows(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _strided_rows(t: torch.Tensor, inner_dims: int) -> tuple[torch.Tensor, int]:
    """``t`` and the distance between its rows, a row being its last
    ``inner_dims`` dims, when those are contiguous and the leading dims step
    evenly (a column slice of a wider output, as the joined projections give);
    else a contiguous copy and the row size."""
    cut = t.dim() - inner_dims
    inner = t.shape[cut:].numel()
    want = 1
    for size, stride in reversed(list(zip(t.shape[cut:], t.stride()[cut:]))):
        if size != 1 and stride != want:
            return _rows(t), inner
        want *= size
    lead = [(size, stride) for size, stride in zip(t.shape[:cut], t.stride()[:cut]) if size != 1]
    if not lead:
        return t, inner
    want = lead[-1][1]
    for size, stride in reversed(lead):
        if stride != want:
            return _rows(t), inner
        want *= size
    return t, lead[-1][1]


def rms_norm(x, weight, eps):
    x2 = _rows(x)
    D = x2.shape[-1]
    y = torch.empty_like(x2)
    if x2.numel():
        _norm_kernel[(x2.numel() // D,)](x2, x2, weight, weight, y, y, D, 0.0, eps, POST=False,
                                         RES=False, PRE=True, BLOCK=triton.next_power_of_2(D),
                                         num_warps=_norm_warps(D))
    return y


def add_rms_norm(residual, a, post_weight, post_eps, weight, eps):
    a2, r2 = _rows(a), _rows(residual)
    D = a2.shape[-1]
    h = torch.empty_like(a2)
    y = torch.empty_like(a2) if weight is not None else a2.new_empty(0)
    if a2.numel():
        w = weight if weight is not None else a2
        _norm_kernel[(a2.numel() // D,)](
            a2, r2, post_weight if post_weight is not None else w, w, h, y if weight is not None else h,
            D, post_eps, eps, POST=post_weight is not None, RES=True, PRE=weight is not None,
            BLOCK=triton.next_power_of_2(D), num_warps=_norm_warps(D))
    return h, y


def norm_rope(x, weight, eps, cos, sin, style):
    B, T, H, D = x.shape
    if (D // 2) & (D // 2 - 1):   # the kernel's rows are power-of-two halves
        return REFERENCES["norm_rope"](x, weight, eps, cos, sin, style)
    x2, sbt = _strided_rows(x, 2)
    y = torch.empty((B, T, H, D), dtype=x.dtype, device=x.device)
    if x2.numel():
        _norm_rope_kernel[(B * T * H,)](x2, weight if weight is not None else x2, _rows(cos),
                                        _rows(sin), y, H, sbt, eps, NORM=weight is not None,
                                        ROPE=style != 0, NEOX=style == 1, HALF=D // 2)
    return y


def decode_attention(q, k, v, mask, scale, valid):
    B, n_kv, G, D = q.shape
    S = k.shape[1]
    if D & (D - 1) or D < 16 or k.stride(-1) != 1 or v.stride(-1) != 1:
        return REFERENCES["decode_attention"](q, k, v, mask, scale, valid)
    qc = q.to(k.dtype)
    if qc.stride(-1) != 1:
        qc = qc.contiguous()
    out = torch.empty((B, n_kv, G, D), dtype=q.dtype, device=q.device)
    if out.numel() == 0 or S == 0:
        return out.zero_()
    GP = max(16, triton.next_power_of_2(G))
    chunk = max(_ATTN_BS, triton.cdiv(triton.cdiv(S, max(1, _ATTN_PROGRAMS // (B * n_kv))),
                                      _ATTN_BS) * _ATTN_BS)
    n_chunks = triton.cdiv(S, chunk)
    acc = torch.empty((B * n_kv, n_chunks, GP, D), dtype=torch.float32, device=q.device)
    ml = torch.empty((B * n_kv, n_chunks, 2, GP), dtype=torch.float32, device=q.device)
    _attn_split_kernel[(B * n_kv, n_chunks)](
        qc, k, v, mask, valid if valid is not None else mask, acc, ml, n_kv, S, chunk, scale,
        qc.stride(0), qc.stride(1), qc.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), mask.stride(0), mask.stride(2), mask.stride(3),
        G=G, GP=GP, D=D, BS=_ATTN_BS, HAS_VALID=valid is not None,
        IEEE=k.dtype == torch.float32)
    _attn_combine_kernel[(B * n_kv,)](acc, ml, out, n_chunks, out.stride(0), out.stride(1),
                                      out.stride(2), n_kv, G=G, GP=GP, D=D)
    return out


def kv_store(cache_k, cache_v, slots, positions, k, v):
    if not (cache_k.is_contiguous() and cache_v.is_contiguous()):
        return REFERENCES["kv_store"](cache_k, cache_v, slots, positions, k, v)
    B, T, n_kv, D = k.shape
    cap = cache_k.shape[1]
    m = min(T, cap)
    if B * m * n_kv:
        k2, sk = _strided_rows(k, 2)
        v2, sv = _strided_rows(v, 2)
        _kv_store_kernel[(B * m * n_kv,)](k2, v2, cache_k, cache_v, _rows(slots),
                                          _rows(positions), T, m, n_kv, cap, D, sk, sv,
                                          BLOCK=triton.next_power_of_2(D))


_ACT_BLOCK = 1024
_MASK_BLOCK = 1024


def decode_mask(lengths, capacity, window):
    B = lengths.shape[0]
    keep = torch.empty((B, capacity), dtype=torch.bool, device=lengths.device)
    valid = torch.empty((B,), dtype=torch.long, device=lengths.device)
    if B:
        _decode_mask_kernel[(B, triton.cdiv(capacity, _MASK_BLOCK))](
            _rows(lengths), keep.view(torch.int8), valid, capacity, window, BLOCK=_MASK_BLOCK)
    return keep, valid


def gated_act(gate, up, act):
    n = gate.shape[-1]
    g, sg = _strided_rows(gate, 1)
    u, su = _strided_rows(up, 1)
    y = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
    if y.numel():
        _gated_act_kernel[(y.numel() // n, triton.cdiv(n, _ACT_BLOCK))](g, u, y, n, sg, su, ACT=act,
                                                                        BLOCK=_ACT_BLOCK)
    return y


KERNELS = {"decode_mask": decode_mask, "gated_act": gated_act, "kv_store": kv_store, "rms_norm": rms_norm, "add_rms_norm": add_rms_norm, "norm_rope": norm_rope,
           "decode_attention": decode_attention}
