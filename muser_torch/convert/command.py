"""``muser-torch convert HF_DIR OUT.gguf --type ...``: the CLI of ``convert``.
It prints what it wrote and how fast: seconds, and GB/s of checkpoint read."""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .pipeline import convert
from .recipes import TYPES

__all__ = ["register", "main"]


def register(subparsers) -> None:
    p = subparsers.add_parser("convert", help="convert a Hugging Face safetensors checkpoint to GGUF")
    p.add_argument("hf_dir", type=Path, help="checkpoint directory (config.json, *.safetensors, tokenizer)")
    p.add_argument("output", type=Path, help="the GGUF file to write (atomically)")
    p.add_argument("--type", choices=TYPES, default="f16",
                   help="f16/bf16/q8_0: llama.cpp's converter; q4_k_m, q3_k_m, q2_k, iq4_xs, iq4_nl, "
                        "mxfp4 (MXFP4_MOE): its converter + llama-quantize; "
                        "q4_k_xl/nvfp4: the Muser lanes (Muse Glimmer)")
    p.add_argument("--device", default="cpu", help="where quantization runs: cpu or cuda")
    p.add_argument("--imatrix", type=Path, help="llama.cpp's imatrix GGUF (for the K-quants)")
    p.add_argument("--pre-tokenizer", help="llama.cpp's name of a BPE pre-tokenizer its converter "
                                           "cannot identify by hash (e.g. 'qwen2')")
    p.add_argument("--target-model-dir", type=Path,
                   help="for a DFlash drafter (MuseGlimmerAssistantModel): its target's checkpoint "
                        "directory, whose vocabulary the draft file carries")
    p.add_argument("--mmproj", action="store_true",
                   help="write Muse Glimmer's vision projector (llama.cpp's mmproj file: f16, bf16 or "
                        "q8_0) instead of the text model")
    p.add_argument("--threads", type=int, help="CPU threads (torch.set_num_threads)")
    p.add_argument("--force", action="store_true",
                   help="overwrite OUT if it exists (replaced only once the new file is complete)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.device not in ("cpu", "cuda") and not args.device.startswith("cuda:"):
        raise ValueError(f"--device must be cpu or cuda, got {args.device!r}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    r = convert(args.hf_dir, args.output, args.type, device=args.device, imatrix=args.imatrix,
                pre_tokenizer=args.pre_tokenizer, progress=False if args.no_progress else None,
                force=args.force, target_model_dir=args.target_model_dir, mmproj=args.mmproj)
    if r.skipped:
        print(f"left out {len(r.skipped)} tensors that are not the text model "
              f"(e.g. {r.skipped[0]}): convert --mmproj writes a vision tower's projector file")
    print(f"wrote {r.path}: {r.tensors} tensors, {r.output_bytes:,} bytes ({args.type}) from "
          f"{r.input_bytes:,} checkpoint bytes in {r.seconds:.2f} s ({r.gb_per_s:.3f} GB/s, "
          f"device {args.device}, {torch.get_num_threads()} threads)")
    return 0
