"""An independent float64 Muse Glimmer forward for tests, written from
docs/muse-glimmer.md ("The math, and where each point comes from").

It shares no code with muser_torch: weights come in as a dict of GGUF tensor
names -> float64 [n_out, n_in] (dequantized by the caller), and attention is
an explicit softmax over a hand-built mask. ``sliding`` is a bool per layer
(true: sliding window, RoPE; false: global, NoPE).
"""
from __future__ import annotations

import torch

POST_NORM_EPS = 1e-8


def reference_logits(w: dict[str, torch.Tensor], cfg, tokens: torch.Tensor,
                     sliding: "list[bool] | tuple[bool, ...]") -> torch.Tensor:
    """float64 logits [T, vocab] for one sequence of token ids [T] starting at position 0."""
    T = tokens.shape[0]
    d, H, KV = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads

    def norm(x, weight=None, eps=cfg.rms_eps):
        y = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)
        return y if weight is None else y * weight.reshape(-1)

    base = cfg.rope_base if cfg.rope_base_swa is None else cfg.rope_base_swa
    pos = torch.arange(T, dtype=torch.float64)
    freqs = 1.0 / base ** (torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
    ang = pos[:, None] * freqs[None, :]                       # [T, d/2]
    cos, sin = torch.cos(ang)[:, None, :], torch.sin(ang)[:, None, :]

    def rot(x):  # x [T, heads, d]; ggml "normal": adjacent pairs (2i, 2i+1)
        a, b = x[..., 0::2], x[..., 1::2]
        out = torch.empty_like(x)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    x = norm(w["token_embd.weight"][tokens])                  # weightless embedding norm
    for il in range(cfg.n_layers):
        p = f"blk.{il}."
        xn = norm(x, w[p + "attn_norm.weight"])
        q = (xn @ w[p + "attn_q.weight"].T).reshape(T, H, d)
        k = (xn @ w[p + "attn_k.weight"].T).reshape(T, KV, d)
        v = (xn @ w[p + "attn_v.weight"].T).reshape(T, KV, d)
        q = norm(q, w[p + "attn_q_norm.weight"])
        k = norm(k, w[p + "attn_k_norm.weight"])
        if sliding[il]:
            q, k = rot(q), rot(k)
        i = torch.arange(T)[:, None]
        j = torch.arange(T)[None, :]
        allowed = j <= i
        if sliding[il]:
            allowed &= (i - j) < cfg.sliding_window
        out = torch.empty(T, H, d, dtype=torch.float64)
        for h in range(H):
            kh = h // (H // KV)
            s = (q[:, h] @ k[:, kh].T) / d ** 0.5
            s = s.masked_fill(~allowed, float("-inf"))
            out[:, h] = torch.softmax(s, dim=-1) @ v[:, kh]
        o = out.reshape(T, H * d) * torch.sigmoid(xn @ w[p + "attn_gate.weight"].T)
        h_ = x + norm(o @ w[p + "attn_output.weight"].T, w[p + "post_attention_norm.weight"],
                      POST_NORM_EPS)
        hn = norm(h_, w[p + "ffn_norm.weight"])
        g = hn @ w[p + "ffn_gate.weight"].T
        u = hn @ w[p + "ffn_up.weight"].T
        f = (g * torch.sigmoid(g) * u) @ w[p + "ffn_down.weight"].T
        x = h_ + norm(f, w[p + "post_ffw_norm.weight"], POST_NORM_EPS)
    logits = norm(x, w["output_norm.weight"]) @ w["output.weight"].T * cfg.logit_scale
    c = cfg.final_softcap
    return c * torch.tanh(logits / c)
