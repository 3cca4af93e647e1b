"""Muse Glimmer's vision tower and adapter over the packed weights of an
``mmproj`` file (``arch/glimmer_vision.py`` holds the facts).

One image (or one temporal group of a video) of ``h x w`` patches:

1. patch embedding: each patch's ``3 x p x p`` pixels through ``v.patch_embd``
   (the file's kernel with the temporal slabs summed), plus the position
   table resampled to the grid (``positions``);
2. ``pre_ln``, then the layers: ``x + attn(ln1(x))``, ``x + mlp(ln2(x))``,
   LayerNorms with biases, GELU (erf) MLP with biases, attention with biased
   q/k/v/out and a 2-D rotary on q and k; a full layer attends over the whole
   frame, a windowed layer within its ``side x side`` window of patches;
3. ``post_ln``, then the 2 x 2 merge: the four patches of each 2 x 2 block
   side by side, channel-major (feature ``c * 4 + s`` is patch ``s``'s ``c``);
4. the adapter ``gelu(mm.1(gelu(mm.0(x))))`` and the projection ``mm.2`` into
   the text model's width. The text model's weightless RMSNorm follows (in
   ``models/glimmer.py``), as for every embedding row.

Windows need no reordering of the rows: a windowed layer gathers each window's
rows, attends, and scatters back (transformers and llama.cpp permute the rows
into window order instead; every other step is per row, so the result is the
same up to the order of float sums).

A forward is two parts (``forward`` = ``run(pixels, plan(grid))``): ``plan``
makes what depends on the grid alone -- the position table's taps and
weights, the rotary tables, the windows' indices, the merge's gather -- on
the host and with host syncs (``nonzero``, ``unique``), and ``run`` is pure
device work over the pixels and that plan, so it can be recorded once per
grid and replayed (``models/vision_engine.py``: CUDA graphs)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..arch.glimmer_vision import ROPE_BASE, VisionConfig, admit_mmproj
from ..nn import QEmbedding, QLinear

__all__ = ["VisionTower", "Grid", "GridPlan"]


@dataclass(frozen=True)
class Grid:
    """A visual input's patch grid: ``t`` temporal groups (1 for an image) of ``h x w`` patches."""
    t: int
    h: int
    w: int

    @property
    def patches(self) -> int:
        return self.t * self.h * self.w

    def rows(self, merge: int) -> int:
        """Embedding rows it becomes (placeholder tokens in the prompt)."""
        return self.t * (self.h // merge) * (self.w // merge)


@dataclass(frozen=True)
class GridPlan:
    """The tensors a forward of one grid needs beside its pixels, on the
    tower's device (``VisionTower.plan``). They depend on the grid and the
    device only, not on any weight, so a plan is kept as long as the tower
    stays where it is."""
    grid: Grid
    pos_index: Tensor        # [h*w*4]: the position table's bilinear taps, 4 per patch
    pos_weight: Tensor       # [h*w, 4]: their weights
    cos: Tensor              # [h*w, head_dim / 2]
    sin: Tensor
    windows: list[Tensor]    # each window's patch indices (windowed layers)
    merge: Tensor            # [h*w]: the 2 x 2 merge's gather


def _vector(gguf: Any, name: str) -> Tensor:
    return gguf.dequantize(name).reshape(-1).clone()


class VisionLayer(nn.Module):
    def __init__(self, cfg: VisionConfig, get_linear, get_vector, il: int):
        super().__init__()
        p = f"v.blk.{il}."
        self.full = cfg.is_full(il)
        self.n_heads, self.eps = cfg.n_heads, cfg.eps
        for name in ("ln1.weight", "ln1.bias", "ln2.weight", "ln2.bias", "attn_q.bias", "attn_k.bias",
                     "attn_v.bias", "attn_out.bias", "ffn_up.bias", "ffn_down.bias"):
            self.register_buffer(name.replace(".", "_"), get_vector(p + name))
        self.wq, self.wk, self.wv = (get_linear(p + f"attn_{x}.weight") for x in "qkv")
        self.wo = get_linear(p + "attn_out.weight")
        self.up, self.down = get_linear(p + "ffn_up.weight"), get_linear(p + "ffn_down.weight")

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, windows: list[Tensor]) -> Tensor:
        """``x``: ``[T, n, hidden]``, one row of frames; ``cos``/``sin``: ``[n, head_dim / 2]``."""
        T, n, d = x.shape
        hd = d // self.n_heads
        h = F.layer_norm(x, (d,), self.ln1_weight, self.ln1_bias, self.eps)
        q, k, v = (lin(h) + b for lin, b in ((self.wq, self.attn_q_bias), (self.wk, self.attn_k_bias),
                                             (self.wv, self.attn_v_bias)))
        q, k, v = (t.view(T, n, self.n_heads, hd).transpose(1, 2) for t in (q, k, v))
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        if self.full:
            a = F.scaled_dot_product_attention(q, k, v)
        else:
            a = torch.empty_like(q)
            for idx in windows:
                a[:, :, idx] = F.scaled_dot_product_attention(q[:, :, idx], k[:, :, idx], v[:, :, idx])
        x = x + self.wo(a.transpose(1, 2).reshape(T, n, d)) + self.attn_out_bias
        h = F.layer_norm(x, (d,), self.ln2_weight, self.ln2_bias, self.eps)
        return x + self.down(F.gelu(self.up(h) + self.ffn_up_bias)) + self.ffn_down_bias


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """ggml's "normal" rotary: pair j of a head is features (2j, 2j + 1) (the
    converter un-permuted q and k into this order), turned by its own angle."""
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig, gguf: Any):
        super().__init__()
        self.config = cfg

        def get_linear(name: str) -> QLinear:
            return QLinear.from_gguf(gguf[name])

        def get_vector(name: str) -> Tensor:
            return _vector(gguf, name)
        t = gguf["v.patch_embd.weight"]
        # ne (p, p, 3, hidden): a row of 3*p*p inputs per output, in (channel, y, x) order
        self.patch = QLinear(t.raw.view(cfg.hidden, t.require_qtype().row_bytes(cfg.patch_pixels)),
                             t.qtype, cfg.hidden, cfg.patch_pixels)
        self.position = QEmbedding.from_gguf(gguf["v.position_embd.weight"])
        for name in ("v.pre_ln.weight", "v.pre_ln.bias", "v.post_ln.weight", "v.post_ln.bias"):
            self.register_buffer(name[2:].replace(".", "_"), get_vector(name))
        self.layers = nn.ModuleList(VisionLayer(cfg, get_linear, get_vector, il) for il in range(cfg.n_layers))
        self.mm0, self.mm1, self.mm2 = (get_linear(f"mm.{i}.weight") for i in range(3))
        quarter = cfg.head_dim // 4
        # one frequency per pair of each half: base^(-4k/head_dim), k < head_dim/4 (transformers'
        # axial inv_freq over head_dim/2 in steps of 2; llama.cpp's rope_2d on each half)
        self.register_buffer("inv_freq", ROPE_BASE ** (-torch.arange(quarter, dtype=torch.float64)
                                                       * 4 / cfg.head_dim).float())

    @classmethod
    def from_gguf(cls, gguf: Any, text_hidden: int | None = None) -> "VisionTower":
        """The tower of a parsed ``mmproj`` file, admitted first
        (``admit_mmproj``: a file for another text width is a VisionMismatchError)."""
        return cls(admit_mmproj(gguf, text_hidden), gguf)

    # -- the pieces that depend only on the grid ---------------------------------------

    def positions(self, h: int, w: int) -> Tensor:
        """The position table resampled to ``h x w`` patches, ``[h*w, hidden]``.

        As the reference does it (transformers reproduces it): bilinear, half-pixel
        centres, taps outside the table weigh zero (``grid_sample``'s zero
        padding), and patch ``i`` of the raster reads the table at row
        ``(i // h)`` of a ``w``-row resampling and column ``(i % h)`` of an
        ``h``-column one -- the reference's meshgrid swaps the axes, which only
        a non-square grid shows. llama.cpp resizes the table plainly (and
        clamps at the border), so it differs on such grids."""
        idx, wt = self.position_taps(h, w)
        return self._resampled(idx, wt)

    def position_taps(self, h: int, w: int) -> tuple[Tensor, Tensor]:
        """``positions``' table rows (4 per patch, flat) and their weights ``[h*w, 4]``, on the device."""
        side = self.config.pos_side
        i = torch.arange(h * w)    # taps on the CPU: float64 there (MPS has none), then moved
        rt, rw = _taps(i // h, w, side)
        ct, cw = _taps(i % h, h, side)
        dev = self.inv_freq.device
        idx = (rt[:, :, None] * side + ct[:, None, :]).reshape(-1).to(dev)
        wt = (rw[:, :, None] * cw[:, None, :]).reshape(-1, 4).to(dev)
        return idx, wt

    def _resampled(self, idx: Tensor, wt: Tensor) -> Tensor:
        rows = self.position(idx).view(wt.shape[0], 4, -1).float()
        return (rows * wt[:, :, None]).sum(1)

    def rotary(self, h: int, w: int) -> tuple[Tensor, Tensor]:
        """cos, sin ``[h*w, head_dim / 2]``: the first half of a head's pairs turns
        with the patch's column + 1, the second half with its row + 1 (the
        reference counts positions from 1)."""
        i = torch.arange(h * w, device=self.inv_freq.device)
        col, row = (i % w + 1).float(), (i // w + 1).float()
        ang = torch.cat((col[:, None] * self.inv_freq, row[:, None] * self.inv_freq), dim=-1)
        return ang.cos(), ang.sin()

    def windows(self, h: int, w: int) -> list[Tensor]:
        """Each window's patch indices: ``side x side`` tiles from the top left."""
        side = self.config.pos_side
        r, c = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        wid = ((r // side) * math.ceil(w / side) + c // side).reshape(-1).to(self.inv_freq.device)
        return [torch.nonzero(wid == k).flatten() for k in torch.unique(wid).tolist()]

    def merge_index(self, h: int, w: int) -> Tensor:
        """The 2 x 2 merge's gather: block by block in raster order, each block's patches in raster order."""
        m = self.config.merge
        i = torch.arange(h * w, device=self.inv_freq.device).view(h // m, m, w // m, m)
        return i.permute(0, 2, 1, 3).reshape(-1)

    def plan(self, grid: Grid) -> GridPlan:
        """What a forward of ``grid`` needs beside the pixels (host work, host syncs)."""
        h, w = grid.h, grid.w
        idx, wt = self.position_taps(h, w)
        cos, sin = self.rotary(h, w)
        return GridPlan(grid, idx, wt, cos, sin, self.windows(h, w), self.merge_index(h, w))

    # -- forward -----------------------------------------------------------------------

    def encode(self, pixels: Tensor, grid: Grid) -> Tensor:
        """The merged ViT rows ``[t * h/2 * w/2, 4 * hidden]`` of one input:
        ``pixels`` ``[t, h*w, 3*p*p]`` (one frame per temporal group)."""
        return self._encode(pixels, self.plan(grid))

    def _encode(self, pixels: Tensor, plan: GridPlan) -> Tensor:
        # device work only: no host sync, no allocation outside the caching allocator
        cfg = self.config
        x = self.patch(pixels.float()) + self._resampled(plan.pos_index, plan.pos_weight)
        x = F.layer_norm(x, (cfg.hidden,), self.pre_ln_weight, self.pre_ln_bias, cfg.eps)
        for layer in self.layers:
            x = layer(x, plan.cos, plan.sin, plan.windows)
        x = F.layer_norm(x, (cfg.hidden,), self.post_ln_weight, self.post_ln_bias, cfg.eps)
        m2 = cfg.merge * cfg.merge
        x = x[:, plan.merge].view(plan.grid.t, -1, m2, cfg.hidden)
        return x.transpose(-1, -2).reshape(-1, cfg.hidden * m2)

    def run(self, pixels: Tensor, plan: GridPlan) -> Tensor:
        """``forward`` of ``pixels`` (on the tower's device) over a grid's ``plan``:
        device work alone, the same ops in the same order as ``forward``."""
        x = self._encode(pixels, plan)
        return self.mm2(F.gelu(self.mm1(F.gelu(self.mm0(x)))))

    def forward(self, pixels: Tensor, grid: Grid) -> Tensor:
        """Embedding rows ``[grid.rows(merge), text_hidden]`` (before the text
        model's embedding norm)."""
        return self.run(pixels, self.plan(grid))


def _taps(index: Tensor, size: int, side: int) -> tuple[Tensor, Tensor]:
    """Bilinear taps and weights into ``side`` table rows for ``index`` of
    ``size`` (half-pixel centres; a tap outside the table weighs zero)."""
    src = (index.double() + 0.5) * side / size - 0.5
    lo = torch.floor(src)
    taps = lo.long()[:, None] + torch.arange(2, device=index.device)
    weight = (1 - (src[:, None] - taps.double()).abs()).clamp(min=0)
    weight = weight * ((taps >= 0) & (taps < side))
    return taps.clamp(0, side - 1), weight.float()
