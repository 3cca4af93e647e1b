"""A numpy emulation of mv.cu's tensor-core kernels (cuda_mm), lane by lane, for
checking a kernel's index logic on a machine without a GPU: each lane's loads and
fragment registers are computed as the kernel text computes them, ``mma`` places
them by the PTX ISA's fragment layout (m16n8k32 / m16n8k16 with .s8 operands) and
multiplies, and the result is compared with gguf's dequantize times the
activation in float64. One warp per 16 rows, no K split; slow (pure Python), so
small shapes only. Run: ``python tools/mm_emulate.py``; each line should show a
relative error near 2e-5 (the two-level activation's), a wrong index gives ~1.

Keep it in step with mv.cu when a kernel's layout changes."""
import numpy as np, gguf, torch
from gguf.quants import dequantize, quantize
rng = np.random.default_rng(0)
LEVEL = 254

def quant_x(x):  # int8dot's two levels (same as _quantize_x_kernel)
    M, n = x.shape
    xb = x.reshape(M, n // 32, 32).astype(np.float32)
    amax = np.abs(xb).max(-1)
    inv = np.where(amax > 0, 127.0 / np.maximum(amax, 1e-30), 0.0).astype(np.float32)
    v = xb * inv[..., None]
    q1 = np.floor(v + 0.5); q2 = np.floor((v - q1) * LEVEL + 0.5)
    q1 = np.clip(q1, -127, 127).astype(np.int32); q2 = np.clip(q2, -127, 127).astype(np.int32)
    dxs = (amax / (127 * 254)).astype(np.float32)
    s32 = (q1 * LEVEL + q2).sum(-1).astype(np.int32)
    return q1.reshape(M, n).astype(np.int8), q2.reshape(M, n).astype(np.int8), dxs, s32

def frag(x, run8):  # the same in _quantize_frag's fragment order (int8dot._quantize_frag_kernel)
    M, n = x.shape
    tiles = -(-M // 8)
    xp = np.zeros((8 * tiles, n), np.float32); xp[:M] = x
    q1, q2, dxs, s32 = quant_x(xp)
    q1 = q1.reshape(8 * tiles, n // 32, 32); q2 = q2.reshape(8 * tiles, n // 32, 32)
    a12 = np.zeros((tiles, n // 32, 32, 16), np.int8); sc = np.zeros((tiles, n // 64, 4, 2, 4), np.float32)
    for tok in range(8 * tiles):
        tile, g = divmod(tok, 8)
        for k in range(32):
            u, at = (k // 8, k % 8) if run8 else ((k % 16) // 4, (k // 16) * 4 + k % 4)
            a12[tile, :, 4 * g + u, at] = q1[tok, :, k]; a12[tile, :, 4 * g + u, at + 8] = q2[tok, :, k]
        for b in range(n // 32):
            sc[tile, b // 2, g // 2, g % 2, b % 2] = dxs[tok, b]
            sc[tile, b // 2, g // 2, g % 2, 2 + b % 2] = dxs[tok, b] * np.float32(s32[tok, b])
    return a12, sc

def fwords(a12, tile, blk, lane):  # a lane's 16-byte fragment load as four words (x1.x, x1.y, x2.x, x2.y)
    v = a12[tile, blk, lane].view(np.uint8)
    return [words(v, 4 * i) for i in range(4)]

def words(b, off):  # little-endian uint32 at byte offset off of uint8 array b
    return int.from_bytes(bytes(b[off:off + 4]), "little")

def bytes4(wd):  # signed bytes of a word
    return np.array([(wd >> (8 * i)) & 0xFF for i in range(4)], dtype=np.uint8).view(np.int8).astype(np.int64)

def mma(A, B):   # A[32 lanes][nreg] words, B[32][nregb]; returns C[32][4] per PTX fragment layout
    k = 4 * len(A[0])       # k32: 4 regs -> 32; k16: 2 regs -> 16
    K = 32 if len(A[0]) == 4 else 16
    Am = np.zeros((16, K), np.int64); Bm = np.zeros((K, 8), np.int64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        if K == 32:
            for i, (r, kk) in enumerate([(g, 4*t), (g+8, 4*t), (g, 16+4*t), (g+8, 16+4*t)]):
                Am[r, kk:kk+4] = bytes4(A[lane][i])
            Bm[4*t:4*t+4, g] = bytes4(B[lane][0]); Bm[16+4*t:16+4*t+4, g] = bytes4(B[lane][1])
        else:
            Am[g, 4*t:4*t+4] = bytes4(A[lane][0]); Am[g+8, 4*t:4*t+4] = bytes4(A[lane][1])
            Bm[4*t:4*t+4, g] = bytes4(B[lane][0])
    Cm = Am @ Bm
    return [[Cm[g, 2*t], Cm[g, 2*t+1], Cm[g+8, 2*t], Cm[g+8, 2*t+1]] for g, t in ((l//4, l%4) for l in range(32))]

def lane_blocks(w, row0, n_out, b, BY):  # each lane's super-block b of its rows g, g + 8 (clamped)
    return [[w[min(r, n_out - 1), b*BY:(b+1)*BY] for r in (row0 + lane // 4, row0 + lane // 4 + 8)]
            for lane in range(32)]

def store(y, acc, row0, n_out, M):  # C fragments acc[lane][tile][4] of rows row0.. into y[tok, row]
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for nt in range(acc.shape[1]):
            for e in range(4):
                row = row0 + g + 8*(e >> 1); tok = 8*nt + 2*t + (e & 1)
                if row < n_out and tok < M: y[tok, row] = acc[lane, nt, e]

def i32(v): return int(np.int64(v).astype(np.int32)) if False else ((v + 2**31) % 2**32) - 2**31

def scale_min(s3, j):
    byte = lambda i: (s3[i >> 2] >> (8 * (i & 3))) & 0xFF
    if j < 4: return byte(j) & 63, byte(j + 4) & 63
    return (byte(j + 4) & 0xF) | ((byte(j - 4) >> 6) << 4), (byte(j + 4) >> 4) | ((byte(j) >> 6) << 4)

def f16(h): return float(np.array([h & 0xFFFF], np.uint16).view(np.float16)[0])

def q4k_mm(w, n_out, nb, a12, sc, M, FIFTH=False, MT=1):
    BY = 176 if FIFTH else 144; QS = 48 if FIFTH else 16; NT = 1 if M <= 8 else 2
    y = np.zeros((M, n_out))
    for wrow0 in range(0, n_out, 16 * MT):
      for mt in range(MT):
        row0 = wrow0 + 16 * mt
        acc = np.zeros((32, NT, 4))
        for b in range(nb):
            L = [dict(g=lane // 4, t=lane % 4, blk=blks) for lane, blks in enumerate(lane_blocks(w, row0, n_out, b, BY))]
            for p in range(4):
                for h in range(2):
                    j = 2*p + h
                    A = []; dsms = []
                    for ln in L:
                        q = [[words(bk, QS + 32*p + 8*ln['t']), words(bk, QS + 32*p + 8*ln['t'] + 4)] for bk in ln['blk']]
                        qh = [[words(bk, 16 + 8*ln['t']), words(bk, 16 + 8*ln['t'] + 4)] for bk in ln['blk']]
                        sh = 4*h; m = 0x0F0F0F0F
                        a = [(q[0][0] >> sh) & m, (q[1][0] >> sh) & m, (q[0][1] >> sh) & m, (q[1][1] >> sh) & m]
                        if FIFTH:
                            a = [a[0] | (((qh[0][0] >> j) & 0x01010101) << 4), a[1] | (((qh[1][0] >> j) & 0x01010101) << 4), a[2] | (((qh[0][1] >> j) & 0x01010101) << 4), a[3] | (((qh[1][1] >> j) & 0x01010101) << 4)]
                        A.append(a)
                        ds = []; ms = []
                        for bk in ln['blk']:
                            hx = words(bk, 0); s3 = [words(bk, 4), words(bk, 8), words(bk, 12)]
                            scl, mm = scale_min(s3, j)
                            ds.append(np.float32(f16(hx)) * np.float32(scl)); ms.append(np.float32(f16(hx >> 16)) * np.float32(mm))
                        dsms.append((ds, ms))
                    for nt in range(NT):
                        B1 = []; B2 = []
                        for lane, ln in enumerate(L):
                            v = fwords(a12, nt, 8*b + j, lane)
                            B1.append(v[:2]); B2.append(v[2:])
                        C1 = mma(A, B1); C2 = mma(A, B2)
                        for lane, ln in enumerate(L):
                            for e in range(4):
                                r, tk = e >> 1, e & 1
                                s4 = sc[nt, 4*b + p, ln['t'], tk]
                                dx, dse = (s4[1], s4[3]) if h else (s4[0], s4[2])
                                c = i32(C1[lane][e] * LEVEL + C2[lane][e])
                                ds, ms = dsms[lane]
                                acc[lane, nt, e] += dx * (ds[r] * np.float32(c)) - ms[r] * dse
        store(y, acc, row0, n_out, M)
    return y

def q6k_mm(w, n_out, nb, a12, sc, M):
    BY = 210; NT = 1 if M <= 8 else 2
    y = np.zeros((M, n_out))
    for row0 in range(0, n_out, 16):
        acc = np.zeros((32, NT, 4))
        for b in range(nb):
            L = []
            for lane, blks in enumerate(lane_blocks(w, row0, n_out, b, BY)):
                g, t = lane // 4, lane % 4
                ql = [[words(bk, 16*i + 4*t) for i in range(8)] for bk in blks]
                qh = [[words(bk, 128 + 16*i + 4*t) for i in range(4)] for bk in blks]
                scw = [[words(bk, 192 + 4*i) for i in range(4)] for bk in blks]
                d = [np.float32(f16(int(bk[208]) | (int(bk[209]) << 8))) for bk in blks]
                L.append(dict(g=g, t=t, ql=ql, qh=qh, scw=scw, d=d))
            for hf in range(2):
                for kq in range(4):
                    for u in range(2):
                        s = 8*hf + 2*kq + u
                        A = []; DS = []
                        for ln in L:
                            a = []; ds = []
                            for r in range(2):
                                lo = (ln['ql'][r][4*hf + 2*(kq & 1) + u] >> (4*(kq >> 1))) & 0x0F0F0F0F
                                hi = ((ln['qh'][r][2*hf + u] >> (2*kq)) & 0x03030303) << 4
                                v = lo | hi
                                a.append(sum((((v >> (8*i)) & 0xFF) - 32 & 0xFF) << (8*i) for i in range(4)))
                                scv = np.array([(ln['scw'][r][s // 4] >> (8*(s % 4))) & 0xFF], np.uint8).view(np.int8)[0]
                                ds.append(ln['d'][r] * np.float32(scv))
                            A.append(a); DS.append(ds)
                        for nt in range(NT):
                            B1 = []; B2 = []
                            for lane, ln in enumerate(L):
                                v = fwords(a12, nt, 8*b + 4*hf + kq, lane)
                                B1.append([v[u]]); B2.append([v[2 + u]])
                            C1 = mma(A, B1); C2 = mma(A, B2)
                            for lane, ln in enumerate(L):
                                for e in range(4):
                                    d2 = sc[nt, 4*b + 2*hf + (kq >> 1), ln['t'], e & 1]
                                    dx = d2[kq & 1]
                                    c = C1[lane][e] * LEVEL + C2[lane][e]
                                    acc[lane, nt, e] += dx * (DS[lane][e >> 1] * c)
        store(y, acc, row0, n_out, M)
    return y

import functools
for qt, fn in ((gguf.GGMLQuantizationType.Q4_K, q4k_mm), (gguf.GGMLQuantizationType.Q5_K, functools.partial(q4k_mm, FIFTH=True)), (gguf.GGMLQuantizationType.Q6_K, q6k_mm)):
    for n_out, n_in, M in ((19, 512, 3), (20, 256, 11)):
        from muser_torch.formats import random_weight
        from muser_torch.formats.types import GGMLType
        rw = random_weight(GGMLType[qt.name], n_out, n_in, generator=torch.Generator().manual_seed(n_out))
        w = rw.packed.numpy()
        wd = dequantize(w, qt).astype(np.float64)
        x = rng.standard_normal((M, n_in)).astype(np.float32)
        a12, sc = frag(x, run8=fn is not q6k_mm)
        nb = n_in // 256
        y = fn(w, n_out, nb, a12, sc, M)
        ref = x.astype(np.float64) @ wd.T
        print(qt.name, n_out, n_in, M, "rel err", np.abs(y - ref).max() / np.abs(ref).max())

def legacy_mm(w, n_out, nblk, a12, sc, M, kind):
    BY = {'Q8_0': 34, 'Q5_0': 22, 'Q4_0': 18}[kind]; NT = 1 if M <= 8 else 2
    y = np.zeros((M, n_out))
    def vsub(wd, k): return sum(((((wd >> (8*i)) & 0xFF) - k) & 0xFF) << (8*i) for i in range(4))
    def spread4(v): return ((v & 1) | ((v & 2) << 7) | ((v & 4) << 14) | ((v & 8) << 21)) << 4
    def codes(blk, t):
        d = np.float32(f16(int(blk[0]) | (int(blk[1]) << 8)))
        if kind == 'Q8_0': return words(blk, 2 + 4*t), words(blk, 2 + 16 + 4*t), d
        if kind == 'Q4_0':
            wd = words(blk, 2 + 4*t); return vsub(wd & 0x0F0F0F0F, 8), vsub((wd >> 4) & 0x0F0F0F0F, 8), d
        wd = words(blk, 6 + 4*t); h = words(blk, 2)
        return vsub((wd & 0x0F0F0F0F) | spread4((h >> (4*t)) & 0xF), 16), vsub(((wd >> 4) & 0x0F0F0F0F) | spread4((h >> (16 + 4*t)) & 0xF), 16), d
    for row0 in range(0, n_out, 16):
        acc = np.zeros((32, NT, 4))
        for b in range(nblk):
            A = []; D = []
            for lane in range(32):
                g, t = lane // 4, lane % 4
                rs = [min(row0+g, n_out-1), min(row0+g+8, n_out-1)]
                cs = [codes(w[r, b*BY:(b+1)*BY], t) for r in rs]
                A.append([cs[0][0], cs[1][0], cs[0][1], cs[1][1]]); D.append([cs[0][2], cs[1][2]])
            for nt in range(NT):
                B1 = []; B2 = []
                for lane in range(32):
                    v = fwords(a12, nt, b, lane)
                    B1.append(v[:2]); B2.append(v[2:])
                C1 = mma(A, B1); C2 = mma(A, B2)
                for lane in range(32):
                    g, t = lane // 4, lane % 4
                    for e in range(4):
                        dx = sc[nt, b // 2, t, e & 1][b % 2]
                        acc[lane, nt, e] += dx * (D[lane][e >> 1] * (C1[lane][e] * LEVEL + C2[lane][e]))
        store(y, acc, row0, n_out, M)
    return y

from muser_torch.formats import random_weight
from muser_torch.formats.types import GGMLType
for kind in ('Q8_0', 'Q5_0', 'Q4_0'):
    for n_out, n_in, M in ((19, 96, 3), (20, 160, 11)):
        rw = random_weight(GGMLType[kind], n_out, n_in, generator=torch.Generator().manual_seed(n_out))
        w = rw.packed.numpy()
        wd = dequantize(w, gguf.GGMLQuantizationType[kind]).astype(np.float64)
        x = rng.standard_normal((M, n_in)).astype(np.float32)
        xp = np.zeros((M, -(-n_in // 256) * 256), np.float32); xp[:, :n_in] = x
        a12, sc = frag(xp, run8=False)
        y = legacy_mm(w, n_out, n_in // 32, a12, sc, M, kind)
        ref = x.astype(np.float64) @ wd.T
        print(kind, n_out, n_in, M, "rel err", np.abs(y - ref).max() / np.abs(ref).max())
