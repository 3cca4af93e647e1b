"""``muser-torch make-tiny``: write a deterministic synthetic Muse Glimmer GGUF
(``general.architecture = "muse-glimmer"``) in one of the Muser lanes (docs/muse-glimmer.md), and
with ``--mmproj`` a random vision projector for it (``mmproj.py``)."""
from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from ..arch.muse_glimmer import GlimmerConfig, reference_pattern
from ..formats.types import QK_K
from ..text.byte_tokenizer import ByteTokenizer
from ..arch.glimmer_recipe import SEED_CONFIG, planned_bytes
from ..arch.glimmer_vision import release_config
from .mmproj import MMPROJ_KINDS, mmproj_bytes, write_random_mmproj
from .vocab import marker_vocab, vocab_size
from .writer import write_tiny

__all__ = ["register", "main", "config_from_args", "check_config"]


def register(subparsers) -> None:
    p = subparsers.add_parser("make-tiny", help="write a deterministic synthetic Muse Glimmer GGUF")
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
    p.add_argument("--vocab", type=int, default=None,
                   help=f"vocabulary size (default {ByteTokenizer.VOCAB_SIZE}: the byte tokenizer; "
                        f"with --mmproj the file carries a {vocab_size()}-token sentencepiece "
                        f"vocabulary with the image markers instead, tiny/vocab.py, and takes no --vocab)")
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--pattern", type=int, default=4,
                   help="global attention every N-th layer counted back from the last (written "
                        "as a bool per layer, as llama.cpp's converter does)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mmproj", type=Path, default=None, metavar="MMPROJ",
                   help="also write a random vision projector for the model, of the released tower's "
                        "geometry (1536 wide, 16 heads, 32 x 32 positions, adapter 4096) and the model's "
                        "width: for `bench model --mmproj` and llama.cpp's llama-mtmd-cli on the same files "
                        "(the text file then gets a vocabulary llama.cpp tokenizes, with a chat template)")
    p.add_argument("--mmproj-layers", type=int, default=50, metavar="N",
                   help="the projector's layers, of the release's 50 (default %(default)s)")
    p.add_argument("--mmproj-type", choices=tuple(MMPROJ_KINDS), default="f16",
                   help="the projector's matrices (default %(default)s)")
    p.set_defaults(func=main)


def config_from_args(args: argparse.Namespace) -> GlimmerConfig:
    if args.shapes == "seed":
        return replace(SEED_CONFIG, weight_precision=args.lane)
    if args.pattern < 1 or args.layers < 1:
        raise ValueError(f"make-tiny: pattern={args.pattern} and layers={args.layers} must be >= 1")
    return GlimmerConfig(
        context_length=args.context, hidden=args.hidden, ffn=args.ffn, n_layers=args.layers,
        n_heads=args.heads, n_kv_heads=args.kv_heads, head_dim=args.head_dim, rms_eps=1e-6,
        sliding_window=args.window, sliding_window_pattern=reference_pattern(args.layers, args.pattern),
        rope_base=10000.0, vocab_size=_vocab(args), weight_precision=args.lane,
        logit_scale=SEED_CONFIG.logit_scale, final_softcap=SEED_CONFIG.final_softcap)


def _vocab(args: argparse.Namespace) -> int:
    if getattr(args, "mmproj", None) is not None:
        if args.vocab is not None:
            raise ValueError(f"make-tiny: --vocab with --mmproj: the text file carries the "
                             f"{vocab_size()}-token vocabulary llama-mtmd-cli reads (tiny/vocab.py)")
        return vocab_size()
    return ByteTokenizer.VOCAB_SIZE if args.vocab is None else args.vocab


def main(args: argparse.Namespace) -> int:
    config = config_from_args(args)
    check_config(config)
    if args.mmproj is not None and args.mmproj_layers < 1:
        raise ValueError(f"make-tiny: --mmproj-layers={args.mmproj_layers} must be >= 1")
    size, params = planned_bytes(config)
    t0 = time.time()
    # beside a projector, a vocabulary llama.cpp tokenizes (llama-mtmd-cli runs the pair)
    tokenizer, tokenizer_types = marker_vocab() if args.mmproj is not None else (None, None)
    write_tiny(args.output, config, args.seed, progress=size > 256 << 20, tokenizer=tokenizer,
               tokenizer_types=tokenizer_types)
    print(f"wrote {args.output}: {config.n_layers} layers, {params:,} parameters, "
          f"{size:,} bytes of tensor data ({size * 8 / params:.2f} bits/weight) "
          f"in {time.time() - t0:.1f} s")
    if args.mmproj is not None:
        vision = release_config(config.hidden, args.mmproj_layers)
        size = mmproj_bytes(vision, args.mmproj_type)
        t0 = time.time()
        write_random_mmproj(args.mmproj, vision, args.mmproj_type, args.seed, progress=size > 256 << 20)
        print(f"wrote {args.mmproj}: a {vision.n_layers}-layer random vision projector "
              f"({args.mmproj_type}, {size:,} bytes of tensor data) in {time.time() - t0:.1f} s")
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
                    ("window", c.sliding_window)):
        if v < 1:
            raise ValueError(f"make-tiny: {what}={v} must be >= 1")
    if c.sliding_window > c.context_length:
        raise ValueError(f"make-tiny: window={c.sliding_window} must be <= context={c.context_length}")
