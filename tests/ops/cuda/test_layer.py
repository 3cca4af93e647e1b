"""The layer ops' CUDA (Triton) kernels (``ops/cuda/layer.py``) against float64
references written here, and against the ops' torch composites
(``ops/layer.py``). Skipped without Triton, and without CUDA unless
TRITON_INTERPRET=1 (the interpreter runs the same kernels on CPU tensors).
Random data is drawn fresh; the seed is in each message (MUSER_TEST_SEED=N)."""
from __future__ import annotations

import math
import os
import random

import pytest
import torch

from muser_torch.ops import layer as layer_ops

from ...random_seed import fresh_seed

try:
    from muser_torch.ops.cuda import layer as kernels
except ImportError:
    kernels = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = pytest.mark.skipif(kernels is None or not (torch.cuda.is_available() or INTERPRET),
                                reason="needs Triton, and CUDA or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 2e-6, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}   # of max |ref|


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _randn(*shape, gen, dtype=torch.float32, scale=1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype).to(DEVICE)


def _norm64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _close(got: torch.Tensor, want: torch.Tensor, dtype, msg: str) -> None:
    got, want = got.double().cpu(), want.double().cpu()
    err = (got - want).abs().max().item() / want.abs().max().item()
    assert err <= TOL[dtype], f"{msg}: relative error {err:.3g} > {TOL[dtype]:.3g}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [640, 1000])
def test_rms_norm(dtype, D):
    seed = fresh_seed()
    g = _gen(seed)
    x, w = _randn(3, 2, D, gen=g, dtype=dtype, scale=3.0), _randn(D, gen=g)
    got = kernels.rms_norm(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    _close(got, _norm64(x, w, 1e-6), dtype, f"seed {seed}")
    _close(got, layer_ops.REFERENCES["rms_norm"](x, w, 1e-6), dtype, f"seed {seed} (composite)")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("post,pre", [(True, True), (False, True), (True, False)])
def test_add_rms_norm(dtype, post, pre):
    seed = fresh_seed()
    g = _gen(seed)
    D = 768
    r, a = _randn(5, D, gen=g, dtype=dtype), _randn(5, D, gen=g, dtype=dtype, scale=10.0)
    wp, w = _randn(D, gen=g), _randn(D, gen=g)
    h, y = kernels.add_rms_norm(r, a, wp if post else None, 1e-8, w if pre else None, 1e-5)
    h64 = r.double() + (_norm64(a, wp, 1e-8) if post else a.double())
    _close(h, h64, dtype, f"seed {seed}: h")
    if pre:
        # y normalises h as stored (rounded to the dtype), as the composite does
        _close(y, _norm64(h, w, 1e-5), dtype, f"seed {seed}: y")
    else:
        assert y.numel() == 0
    hr, yr = layer_ops.REFERENCES["add_rms_norm"](r, a, wp if post else None, 1e-8,
                                                  w if pre else None, 1e-5)
    _close(h, hr, dtype, f"seed {seed}: h vs composite")


def _rope64(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: int) -> torch.Tensor:
    x, c, s = x.double(), cos.double(), sin.double()
    D = x.shape[-1]
    if style == layer_ops.ROPE_NEOX:
        i1, i2 = torch.arange(D // 2), torch.arange(D // 2) + D // 2
    else:
        i1, i2 = torch.arange(0, D, 2), torch.arange(1, D, 2)
    out = x.clone()
    out[..., i1] = x[..., i1] * c - x[..., i2] * s
    out[..., i2] = x[..., i2] * c + x[..., i1] * s
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", [layer_ops.ROPE_NONE, layer_ops.ROPE_NEOX, layer_ops.ROPE_NORMAL])
@pytest.mark.parametrize("with_norm", [True, False])
def test_norm_rope(dtype, style, with_norm):
    seed = fresh_seed()
    g = _gen(seed)
    B, T, H, D = 2, 3, 4, 64
    x = _randn(B, T, H, D, gen=g, dtype=dtype, scale=2.0)
    w = _randn(D, gen=g) if with_norm else None
    ang = torch.rand(B, T, 1, D // 2, generator=g, dtype=torch.float64) * 50
    cos, sin = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    got = kernels.norm_rope(x, w, 1e-6, cos, sin, style)
    normed = _norm64(x, w, 1e-6) if with_norm else x.double()
    want = normed if style == layer_ops.ROPE_NONE else _rope64(normed, cos, sin, style)
    _close(got, want, dtype, f"seed {seed}")
    _close(got, layer_ops.REFERENCES["norm_rope"](x, w, 1e-6, cos, sin, style), dtype,
           f"seed {seed} (composite)")


def _attention64(q, k, v, keep, scale):
    """q [B, n_kv, G, D], k/v [B, S, n_kv, D], keep [B, 1, G, S], in float64."""
    q, k, v = q.double(), k.double().transpose(1, 2), v.double().transpose(1, 2)
    s = (q @ k.transpose(-1, -2)) * scale
    s = s.masked_fill(~keep, -math.inf)
    return torch.softmax(s, -1) @ v


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("S,G,valid_at", [(200, 4, None), (300, 5, 130), (64, 16, 64), (17, 1, 9)])
def test_decode_attention(dtype, S, G, valid_at):
    seed = fresh_seed()
    g = _gen(seed)
    B, n_kv, D = 2, 2, 64
    cache = torch.float32 if dtype == torch.float32 else torch.float16
    q = _randn(B, n_kv, G, D, gen=g, dtype=dtype)
    k, v = _randn(B, S, n_kv, D, gen=g, dtype=cache), _randn(B, S, n_kv, D, gen=g, dtype=cache)
    keep = torch.rand(B, 1, 1, S, generator=g) < 0.7           # one row per batch row, as decode
    n = valid_at if valid_at is not None else S
    keep[..., n:] = False                                        # entries past valid are empty
    keep[..., 0] = True
    keep = keep.expand(B, 1, G, S).to(DEVICE)
    valid = None if valid_at is None else torch.full((B,), n, dtype=torch.long, device=DEVICE)
    scale = 1 / math.sqrt(D)
    want = _attention64(q.to(cache), k, v, keep, scale)   # q in the cache's dtype, as the op rounds it
    # poison the entries a valid count skips: a kernel that reads them fails
    if valid is not None:
        k[:, n:], v[:, n:] = float("nan"), float("nan")
    got = kernels.decode_attention(q, k, v, keep, scale, valid)
    assert got.dtype == dtype and got.shape == q.shape
    _close(got, want, dtype, f"seed {seed}")


@pytest.mark.parametrize("T,cap", [(1, 8), (3, 8), (11, 8)])
def test_kv_store(T, cap):
    seed = fresh_seed()
    g = _gen(seed)
    slots_n, n_kv, D = 3, 2, 48
    ck = _randn(slots_n, cap, n_kv, D, gen=g, dtype=torch.float16)
    cv = _randn(slots_n, cap, n_kv, D, gen=g, dtype=torch.float16)
    k, v = _randn(2, T, n_kv, D, gen=g), _randn(2, T, n_kv, D, gen=g)
    slots = torch.tensor([2, 0], device=DEVICE)
    positions = torch.tensor([[5 + t for t in range(T)], [17 + t for t in range(T)]], device=DEVICE)
    want_k, want_v = ck.clone(), cv.clone()
    for b in range(2):                      # the last min(T, cap) positions, one by one
        for t in range(max(0, T - cap), T):
            e = int(positions[b, t]) % cap
            want_k[slots[b], e], want_v[slots[b], e] = k[b, t].half(), v[b, t].half()
    kernels.kv_store(ck, cv, slots, positions, k, v)
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v), f"seed {seed}"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("act", [layer_ops.ACT_SILU, layer_ops.ACT_GELU_TANH, layer_ops.ACT_SIGMOID])
def test_gated_act(dtype, act):
    seed = fresh_seed()
    g = _gen(seed)
    gate, up = _randn(3, 1500, gen=g, dtype=dtype, scale=4.0), _randn(3, 1500, gen=g, dtype=dtype)
    got = kernels.gated_act(gate, up, act)
    x = gate.double()
    f = {layer_ops.ACT_SILU: x * torch.sigmoid(x),
         layer_ops.ACT_GELU_TANH: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
         layer_ops.ACT_SIGMOID: torch.sigmoid(x)}[act]
    _close(got, f * up.double(), dtype, f"seed {seed}")
    _close(got, layer_ops.REFERENCES["gated_act"](gate, up, act), dtype, f"seed {seed} (composite)")


def test_strided_inputs_read_in_place():
    """Column slices of a wider output (the joined projections' q, k, v, gate and
    up) give the same results as contiguous copies, without being copied."""
    seed = fresh_seed()
    g = _gen(seed)
    B, T, H, D = 2, 3, 2, 32
    wide = _randn(B, T, 5 * H * D, gen=g, dtype=torch.float16)
    q = wide[..., H * D:3 * H * D].view(B, T, 2 * H, D)
    _, stride = kernels._strided_rows(q, 2)
    assert stride == 5 * H * D
    w = _randn(D, gen=g)
    ang = torch.rand(B, T, 1, D // 2, generator=g, dtype=torch.float64)
    cos, sin = ang.cos().float().to(DEVICE), ang.sin().float().to(DEVICE)
    for style in (layer_ops.ROPE_NEOX, layer_ops.ROPE_NORMAL):
        assert torch.equal(kernels.norm_rope(q, w, 1e-6, cos, sin, style),
                           kernels.norm_rope(q.contiguous(), w, 1e-6, cos, sin, style)), f"seed {seed}"
    gate, up = wide[..., :H * D], wide[..., 2 * H * D:3 * H * D]
    assert torch.equal(kernels.gated_act(gate, up, layer_ops.ACT_SILU),
                       kernels.gated_act(gate.contiguous(), up.contiguous(), layer_ops.ACT_SILU))
    ck = torch.zeros(2, 8, H, D, dtype=torch.float16, device=DEVICE)
    cv = torch.zeros_like(ck)
    k, v = wide[..., :H * D].view(B, T, H, D), wide[..., 4 * H * D:].view(B, T, H, D)
    slots, pos = torch.tensor([1, 0], device=DEVICE), torch.tensor([[0, 1, 2], [5, 6, 7]], device=DEVICE)
    kernels.kv_store(ck, cv, slots, pos, k, v)
    want_k, want_v = torch.zeros_like(ck), torch.zeros_like(cv)
    layer_ops.REFERENCES["kv_store"](want_k, want_v, slots, pos, k, v)
    assert torch.equal(ck, want_k) and torch.equal(cv, want_v), f"seed {seed}"


@pytest.mark.parametrize("cap,window", [(8, 0), (8, 5), (300, 0), (1100, 700)])
def test_decode_mask(cap, window):
    """Against the ring formula evaluated entry by entry in Python."""
    seed = fresh_seed()
    rng = random.Random(seed)
    lengths = [rng.randrange(0, 3 * cap) for _ in range(3)] + [0, cap - 1, cap]
    keep, valid = kernels.decode_mask(torch.tensor(lengths, device=DEVICE), cap, window)
    for b, n in enumerate(lengths):       # n cached tokens, the new one at position n
        for i in range(cap):
            held = [p for p in range(n + 1) if p % cap == i]
            want = bool(held) and (window == 0 or n - max(held) < window)
            assert bool(keep[b, i]) == want, f"seed {seed}: length {n}, entry {i}"
        assert int(valid[b]) == min(n + 1, cap)
    ref_keep, ref_valid = layer_ops.REFERENCES["decode_mask"](torch.tensor(lengths), cap, window)
    assert torch.equal(keep.cpu(), ref_keep) and torch.equal(valid.cpu(), ref_valid)
