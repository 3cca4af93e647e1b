"""Quantize the trained demo into both lanes and measure held-out perplexity.

    python demo/make_demo.py [--ckpt demo/build/demo_float.pt]

Writes demo/glimmer-demo-q4_k_xl.gguf and demo/glimmer-demo-nvfp4.gguf
with the lanes' recipes (muser_torch.tiny.recipe_type; docs/muse-glimmer.md), then evaluates the
float model and both files on the held-out standard-library files: perplexity
per byte, bits per byte, and how often each lane's top token differs from the
float model's (the lanes' quality figures, docs/muse-glimmer.md). The K-quants use an
importance matrix (mean squared input of every projection over training
text), as llama.cpp's imatrix does.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from muser_torch import Glimmer  # noqa: E402
from muser_torch.formats import GGMLType, quantize  # noqa: E402
from muser_torch.glimmer import gguf_names, module_name  # noqa: E402
from muser_torch.gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX, save_gguf  # noqa: E402
from muser_torch.tiny import gguf_metadata, plan  # noqa: E402
from muser_torch.text.byte_tokenizer import ByteTokenizer  # noqa: E402
from train_demo import HERE, stdlib_files, token_stream  # noqa: E402


@torch.no_grad()
def importance(model: Glimmer, stream: torch.Tensor, windows: int, seq: int) -> dict[str, torch.Tensor]:
    """GGUF name -> mean squared input per column, for every nn.Linear."""
    sums: dict[str, torch.Tensor] = {}
    hooks = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear):
            def hook(m, args, out, name=name):
                x = args[0].reshape(-1, args[0].shape[-1]).float()
                sums[name] = sums.get(name, 0) + x.pow(2).mean(0)
            hooks.append(mod.register_forward_hook(hook))
    g = torch.Generator().manual_seed(1)
    for s in torch.randint(0, stream.numel() - seq, (windows,), generator=g).tolist():
        model(stream[None, s:s + seq])
    for h in hooks:
        h.remove()
    by_module = {f"{k}.weight": v / windows for k, v in sums.items()}
    return {n: by_module[module_name(n)] for n in gguf_names(model.config) if module_name(n) in by_module}


def export(model: Glimmer, lane: str, path: Path, imatrix: dict[str, torch.Tensor]) -> None:
    config = replace(model.config, weight_precision=lane)
    state = model.state_dict()
    tensors: dict = {}
    for name, qtype, _, _ in plan(config):
        w = state[module_name(name)].detach().float()
        if qtype == GGMLType.F32:
            tensors[name] = (qtype, w.contiguous())
        elif qtype == GGMLType.NVFP4_E2M1:
            payload, scales, scale_2 = quantize(w, qtype)
            tensors[name] = (qtype, payload)
            tensors[name + SCALE_SUFFIX] = (GGMLType.F8_E4M3FN, scales.view(torch.uint8))
            tensors[name + SCALE2_SUFFIX] = (GGMLType.F32, torch.as_tensor(scale_2, dtype=torch.float32).reshape(1))
        else:
            tensors[name] = (qtype, quantize(w, qtype, imatrix=imatrix.get(name)))
    md = gguf_metadata(config, f"glimmer-demo-{lane}")
    md["general.description"] = ("byte-level Muse Glimmer (the released architecture at toy size) "
                                 "trained on the Python standard library's source "
                                 "(demo/train_demo.py)")
    save_gguf(path, md, tensors)


@torch.no_grad()
def evaluate(model: Glimmer, held: torch.Tensor, seq: int, windows: int,
             reference_top: torch.Tensor | None = None) -> dict:
    nll, count, tops = 0.0, 0, []
    for i in range(windows):
        chunk = held[None, i * seq:(i + 1) * seq + 1]
        logits = model(chunk[:, :-1]).float()
        nll += float(F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum"))
        count += seq
        tops.append(logits[0].argmax(-1))
    top = torch.cat(tops)
    out = {"tokens": count, "ppl": math.exp(nll / count), "bits_per_byte": nll / count / math.log(2)}
    if reference_top is not None:
        out["top1_disagreement"] = float((top != reference_top).float().mean())
    return out, top


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt", type=Path, default=HERE / "build" / "demo_float.pt")
    ap.add_argument("--windows", type=int, default=128, help="held-out windows of --seq bytes")
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lanes", nargs="+", default=["q4_k_xl", "nvfp4"])
    args = ap.parse_args()
    torch.set_num_threads(1)
    ckpt = torch.load(args.ckpt, weights_only=False)
    model = Glimmer(ckpt["config"])
    model.load_state_dict(ckpt["state_dict"])
    model.eval()
    tok = ByteTokenizer()
    train_files, held_files = stdlib_files()
    held = token_stream(held_files, tok)
    windows = min(args.windows, (held.numel() - 1) // args.seq)

    t0 = time.time()
    imatrix = importance(model, token_stream(train_files[:200], tok), 32, args.seq)
    results = {"steps": ckpt.get("steps"), "minutes": ckpt.get("minutes"),
               "held_out_files": len(held_files), "held_out_bytes": held.numel()}
    results["float"], ref_top = evaluate(model, held, args.seq, windows)
    print("float", results["float"], flush=True)
    for lane in args.lanes:
        path = HERE / f"glimmer-demo-{lane}.gguf"
        export(model, lane, path, imatrix)
        packed = Glimmer.from_gguf(path, dtype=torch.float32)
        results[lane], _ = evaluate(packed, held, args.seq, windows, ref_top)
        results[lane]["file_bytes"] = path.stat().st_size
        results[lane]["weight_bytes_per_token"] = packed.weight_bytes_per_token()
        print(lane, results[lane], flush=True)
    if "q4_k_xl" in results and "nvfp4" in results:
        results["nvfp4_vs_q4_k_xl_ppl_ratio"] = results["nvfp4"]["ppl"] / results["q4_k_xl"]["ppl"]
    (HERE / "build").mkdir(exist_ok=True)
    (HERE / "build" / "eval.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
