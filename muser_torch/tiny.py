"""Synthetic Glimmers: the seed's weight recipe, random packed weights, and
``muser-torch make-tiny``.

Weights are random packed blocks, not quantized floats: every quant byte is
uniform, and only the scale fields are set, so that each tensor's values have
a chosen standard deviation (1/sqrt(n_in) for projections, 1 for the
embedding, norms near 1). That makes a model of any size, the seed's 52
layers included, in the time it takes to draw random bytes, on any device,
and it is still a valid file every reader must decode exactly.

The recipe (seed Chapter 6 §6.5, Figure 6.6; GLIMMER.md):

  q4_k_xl lane   Q4_K everywhere, except
                 ffn_down  Q6_K on even layers (26 of 52: "alternating by layer")
                 attn_v    Q6_K on odd layers  (26 of 52, a quarter of the k/v tensors)
                 output    Q5_K (the lm_head)
  nvfp4 lane     every projection (lm_head included) NVFP4_E2M1 + companions,
                 the embedding Q4_K
  both           norms F32, token_embd Q4_K
"""
from __future__ import annotations

import argparse
import functools
import os
import time
from dataclasses import replace
from pathlib import Path

import torch

from .config import GlimmerConfig
from .formats import GGMLType
from .ops.unpack import dequantize
from .formats.types import NVFP4_GROUP, QK_K
from .glimmer import gguf_names
from .tokenizer import ByteTokenizer

SEED_CONFIG = GlimmerConfig(
    context_length=131072, hidden=6656, ffn=19968, n_layers=52, n_heads=32, n_kv_heads=2,
    head_dim=128, rms_eps=1e-6, sliding_window=2048, sliding_window_pattern=4,
    rope_base=1_000_000.0, vocab_size=202048)


def recipe_type(config: GlimmerConfig, name: str) -> GGMLType:
    """The GGML type of tensor ``name`` under the seed's recipe for the config's lane."""
    if name.endswith("norm.weight"):
        return GGMLType.F32
    if name == "token_embd.weight":
        return GGMLType.Q4_K
    if config.weight_precision == "nvfp4":
        return GGMLType.NVFP4_E2M1
    if config.weight_precision != "q4_k_xl":
        raise ValueError(f"unknown weight_precision {config.weight_precision!r}; expected q4_k_xl or nvfp4")
    if name == "output.weight":
        return GGMLType.Q5_K
    il = int(name.split(".")[1])
    if name.endswith("ffn_down.weight") and il % 2 == 0:
        return GGMLType.Q6_K
    if name.endswith("attn_v.weight") and il % 2 == 1:
        return GGMLType.Q6_K
    return GGMLType.Q4_K


# ---- random packed bytes with sane scales --------------------------------------

# Where each format keeps its f16 super-scale (and super-min), and the min that
# centres uniform codes on zero: Q4_K codes average 7.5, Q5_K 15.5. Q4_K and
# Q5_K open with d, dmin; Q6_K ends with d (formats/types.py spells the blocks).
_KQUANT_FIELDS = {GGMLType.Q4_K: (0, 2, 7.5), GGMLType.Q5_K: (0, 2, 15.5),
                  GGMLType.Q6_K: (GGMLType.Q6_K.block_bytes - 2, None, 0.0)}


def _set_f16(blocks: torch.Tensor, offset: int, value: float) -> None:
    b = torch.tensor([value], dtype=torch.float16).view(torch.uint8).to(blocks.device)
    blocks[..., offset:offset + 2] = b


def _nvfp4_scales(rows: int, n_in: int, gen: torch.Generator, device) -> torch.Tensor:
    # E4M3FN bytes with exponent field 6 or 7 (values 0.5 .. 1.875), never NaN.
    g = n_in // NVFP4_GROUP
    exp = torch.randint(6, 8, (rows, g), dtype=torch.uint8, device=device, generator=gen)
    man = torch.randint(0, 8, (rows, g), dtype=torch.uint8, device=device, generator=gen)
    return (exp << 3) | man


def _raw(qtype: GGMLType, rows: int, n_in: int, gen: torch.Generator, device,
         scale: float) -> tuple[torch.Tensor, dict]:
    """Random blocks whose scale fields are ``scale`` times the unit setting."""
    packed = torch.randint(0, 256, (rows, qtype.row_bytes(n_in)), dtype=torch.uint8,
                           device=device, generator=gen)
    if qtype == GGMLType.NVFP4_E2M1:
        scales = _nvfp4_scales(rows, n_in, gen, device)
        return packed, {"scales": scales,
                        "scale_2": torch.tensor([scale], dtype=torch.float32, device=device)}
    d_off, m_off, centre = _KQUANT_FIELDS[qtype]
    blocks = packed.view(rows, -1, qtype.block_bytes)
    _set_f16(blocks, d_off, scale)
    if m_off is not None:
        _set_f16(blocks, m_off, scale * centre)
    return packed, {}


@functools.lru_cache(maxsize=None)
def _unit_std(qtype: GGMLType) -> float:
    """Standard deviation of random blocks at unit scale (measured once, on CPU)."""
    gen = torch.Generator().manual_seed(1234)
    packed, extra = _raw(qtype, 64, 1024, gen, "cpu", 1.0)
    return float(dequantize(packed, qtype, 1024, **extra).std())


def random_rows(qtype: GGMLType, rows: int, n_in: int, gen: torch.Generator,
                device, std: float) -> tuple[torch.Tensor, dict]:
    """``rows`` random packed rows of ``qtype`` whose values have about ``std``
    standard deviation; NVFP4_E2M1 also returns its companions in the dict."""
    qtype = GGMLType.parse(qtype)
    if qtype == GGMLType.F32:
        w = 1.0 + 0.1 * torch.randn(rows, n_in, generator=gen, device=device)
        return w.contiguous().view(torch.uint8), {}
    if qtype not in (*_KQUANT_FIELDS, GGMLType.NVFP4_E2M1):
        raise ValueError(f"random weights: {qtype.name} is not a recipe type")
    return _raw(qtype, rows, n_in, gen, device, std / _unit_std(qtype))


def tensor_std(name: str, n_in: int) -> float:
    return 1.0 if name == "token_embd.weight" else n_in ** -0.5


# ---- the file ------------------------------------------------------------------

def plan(config: GlimmerConfig, qk_norm: bool = False) -> list[tuple[str, GGMLType, int, int]]:
    """Every tensor of the file in write order: (name, qtype, n_out, n_in)."""
    return [(name, recipe_type(config, name), n_out, n_in)
            for name, (n_out, n_in) in gguf_names(config, qk_norm).items()]


def planned_bytes(config: GlimmerConfig, qk_norm: bool = False) -> tuple[int, int]:
    """(tensor data bytes, weight parameters) of the file ``plan`` describes;
    parameters exclude norms, as the seed counts them."""
    total = params = 0
    for name, qtype, n_out, n_in in plan(config, qk_norm):
        total += n_out * qtype.row_bytes(n_in)
        if qtype == GGMLType.NVFP4_E2M1:
            total += n_out * (n_in // NVFP4_GROUP) + 4    # E4M3 scales, f32 scale_2
        if qtype != GGMLType.F32:
            params += n_out * n_in
    return total, params


def gguf_metadata(config: GlimmerConfig, name: str) -> dict:
    """A synthetic or demo file's metadata: the config, the byte tokenizer when
    the vocabulary is bytes, and ``general.name``."""
    metadata = config.to_metadata()
    if config.vocab_size == ByteTokenizer.VOCAB_SIZE:
        metadata |= ByteTokenizer().to_metadata()
    metadata["general.name"] = name
    return metadata


def write_tiny(path: str | os.PathLike, config: GlimmerConfig, seed: int = 0,
               qk_norm: bool = False, progress: bool = False, chunk_bytes: int = 64 << 20) -> None:
    """Write a deterministic synthetic Glimmer GGUF without ever holding a whole
    tensor: ``save_gguf`` lays out the header with every tensor left as a hole
    (a sparse file), then each tensor is drawn in row chunks of about
    ``chunk_bytes`` and written at its offset. The file appears under ``path``
    only once complete."""
    from .gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX, load_gguf, save_gguf

    path = Path(path)
    tensors = plan(config, qk_norm)
    layout: dict = {}
    for name, qtype, n_out, n_in in tensors:
        ne = (n_in,) if n_out == 1 else (n_in, n_out)
        layout[name] = (qtype, None, ne)
        if qtype == GGMLType.NVFP4_E2M1:
            layout[name + SCALE_SUFFIX] = (GGMLType.F8_E4M3FN, None, (n_in // NVFP4_GROUP, n_out))
            layout[name + SCALE2_SUFFIX] = (GGMLType.F32, None, (1,))
    tmp = path.with_name(path.name + ".filling")
    save_gguf(tmp, gguf_metadata(config, f"glimmer-tiny-seed{seed}"), layout, progress=False)
    try:
        offsets = {n: t.offset for n, t in load_gguf(tmp).tensors.items()}
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=planned_bytes(config, qk_norm)[0], unit="B", unit_scale=True,
                       desc=f"writing {path.name}")
        gen = torch.Generator().manual_seed(seed)
        with open(tmp, "r+b") as f:
            for name, qtype, n_out, n_in in tensors:
                std = tensor_std(name, n_in)
                row_bytes = qtype.row_bytes(n_in)
                step = max(1, chunk_bytes // row_bytes)
                for r in range(0, n_out, step):
                    rows = min(step, n_out - r)
                    packed, extra = random_rows(qtype, rows, n_in, gen, "cpu", std)
                    f.seek(offsets[name] + r * row_bytes)
                    f.write(packed.numpy().tobytes())
                    if extra:  # NVFP4 companions, row-aligned with the payload
                        f.seek(offsets[name + SCALE_SUFFIX] + r * (n_in // NVFP4_GROUP))
                        f.write(extra["scales"].numpy().tobytes())
                        f.seek(offsets[name + SCALE2_SUFFIX])
                        f.write(extra["scale_2"].numpy().tobytes())
                    if bar is not None:
                        bar.update(packed.numel() + (extra["scales"].numel() + 4 * (r == 0) if extra else 0))
        if bar is not None:
            bar.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# ---- the command ---------------------------------------------------------------

def register(subparsers) -> None:
    p = subparsers.add_parser("make-tiny", help="write a deterministic synthetic Glimmer GGUF")
    p.add_argument("output", type=Path)
    p.add_argument("--shapes", choices=("tiny", "seed"), default="tiny",
                   help="'seed' writes the full 52-layer release geometry (~16.7 GB)")
    p.add_argument("--lane", choices=("q4_k_xl", "nvfp4"), default="q4_k_xl")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--kv-heads", type=int, default=1)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--ffn", type=int, default=512)
    p.add_argument("--vocab", type=int, default=ByteTokenizer.VOCAB_SIZE)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--pattern", type=int, default=4)
    p.add_argument("--qk-norm", action="store_true", help="add per-head q/k norms")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> GlimmerConfig:
    if args.shapes == "seed":
        return replace(SEED_CONFIG, weight_precision=args.lane)
    return GlimmerConfig(
        context_length=args.context, hidden=args.hidden, ffn=args.ffn, n_layers=args.layers,
        n_heads=args.heads, n_kv_heads=args.kv_heads, head_dim=args.head_dim, rms_eps=1e-6,
        sliding_window=args.window, sliding_window_pattern=args.pattern, rope_base=10000.0,
        vocab_size=args.vocab, weight_precision=args.lane)


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    check_config(config)
    size, params = planned_bytes(config, args.qk_norm)
    t0 = time.time()
    write_tiny(args.output, config, args.seed, args.qk_norm, progress=size > 256 << 20)
    print(f"wrote {args.output}: {config.n_layers} layers, {params:,} parameters, "
          f"{size:,} bytes of tensor data ({size * 8 / params:.2f} bits/weight) "
          f"in {time.time() - t0:.1f} s")
    return 0


def check_config(c: GlimmerConfig) -> None:
    """Refuse shapes the recipe cannot pack, naming the argument."""
    for what, v in (("hidden", c.hidden), ("ffn", c.ffn), ("heads*head-dim", c.q_dim)):
        if v <= 0 or v % QK_K:
            raise ValueError(f"make-tiny: {what}={v} must be a positive multiple of {QK_K} "
                             f"(K-quant rows are {QK_K}-element super-blocks)")
    if c.n_heads % max(c.n_kv_heads, 1) or c.n_kv_heads < 1:
        raise ValueError(f"make-tiny: heads={c.n_heads} must be a multiple of kv-heads={c.n_kv_heads}")
    if c.head_dim % 2:
        raise ValueError(f"make-tiny: head-dim={c.head_dim} must be even (RoPE pairs)")
    for what, v in (("layers", c.n_layers), ("vocab", c.vocab_size), ("context", c.context_length),
                    ("window", c.sliding_window), ("pattern", c.sliding_window_pattern)):
        if v < 1:
            raise ValueError(f"make-tiny: {what}={v} must be >= 1")
