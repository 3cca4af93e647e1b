"""An independent float64 Glimmer forward for tests, written from GLIMMER.md.

It shares no code with muser_torch.glimmer: weights come in as a dict of
GGUF tensor names -> float64 [n_out, n_in] (dequantized by the caller), and
attention is an explicit loop-free softmax over a hand-built mask.
"""
from __future__ import annotations

import torch


def reference_logits(w: dict[str, torch.Tensor], cfg, tokens: torch.Tensor) -> torch.Tensor:
    """float64 logits [T, vocab] for one sequence of token ids [T] starting at position 0."""
    T = tokens.shape[0]
    d, H, KV = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads

    def norm(x, weight):
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_eps) * weight.reshape(-1)

    pos = torch.arange(T, dtype=torch.float64)
    freqs = 1.0 / cfg.rope_base ** (torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
    ang = pos[:, None] * freqs[None, :]                       # [T, d/2]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

    def rot(x):  # x [T, heads, d], rotate-half pairs (i, i + d/2)
        a, b = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)

    x = w["token_embd.weight"][tokens]
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        xn = norm(x, w[p + "attn_norm.weight"])
        q = (xn @ w[p + "attn_q.weight"].T).reshape(T, H, d)
        k = (xn @ w[p + "attn_k.weight"].T).reshape(T, KV, d)
        v = (xn @ w[p + "attn_v.weight"].T).reshape(T, KV, d)
        if p + "attn_q_norm.weight" in w:
            q = norm(q, w[p + "attn_q_norm.weight"])
            k = norm(k, w[p + "attn_k_norm.weight"])
        q, k = rot(q), rot(k)
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        allowed = j <= i
        if (il + 1) % cfg.sliding_window_pattern != 0:
            allowed &= (i - j) < cfg.sliding_window
        out = torch.empty(T, H, d, dtype=torch.float64)
        for h in range(H):
            kh = h // (H // KV)
            s = (q[:, h] @ k[:, kh].T) / d ** 0.5
            s = s.masked_fill(~allowed, float("-inf"))
            out[:, h] = torch.softmax(s, dim=-1) @ v[:, kh]
        o = out.reshape(T, H * d) * torch.sigmoid(xn @ w[p + "attn_gate.weight"].T)
        h_ = x + o @ w[p + "attn_output.weight"].T
        hn = norm(h_, w[p + "ffn_norm.weight"])
        g = hn @ w[p + "ffn_gate.weight"].T
        u = hn @ w[p + "ffn_up.weight"].T
        x = h_ + (g * torch.sigmoid(g) * u) @ w[p + "ffn_down.weight"].T
    return norm(x, w["output_norm.weight"]) @ w["output.weight"].T
