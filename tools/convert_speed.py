"""Conversion speed, side by side with llama.cpp: a random Llama checkpoint of
about ``--params`` parameters (bf16, sharded, written once into ``--dir``) to
q4_k_m by ``muser-torch convert`` on ``--device``, and by llama-quantize
from the same F16 GGUF (which ``muser-torch convert --type f16`` writes,
byte-identical with llama.cpp's converter), interleaved ``--repeats`` times.
Prints seconds and GB/s (checkpoint bytes over seconds) of each, and checks
the two q4_k_m files are the same bytes.

    python tools/convert_speed.py --params 1e9 --threads 2                # CPU
    python tools/convert_speed.py --params 1e9 --device cuda              # GPU
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def llama_shape(params: float) -> dict:
    """A Llama-like geometry of about ``params`` parameters (hidden 2048, ffn 4x)."""
    hidden, ffn, vocab = 2048, 8192, 32000
    per_layer = hidden * hidden * 2 + 2 * hidden * (hidden // 4) + 3 * hidden * ffn
    layers = max(1, round((params - 2 * vocab * hidden) / per_layer))
    return dict(hidden=hidden, ffn=ffn, n_layers=layers, n_heads=16, n_kv_heads=4, vocab=vocab)


def write_checkpoint(directory: Path, shape: dict, seed: int = 0, shard_bytes: int = 1 << 30) -> None:
    """config.json, a sentencepiece tokenizer and bf16 shards of random weights,
    one tensor generated at a time."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, LlamaConfig

    from tests.convert.checkpoints import write_sentencepiece
    from tests.text.tiny_tokenizers import LLAMA2_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    write_sentencepiece(directory, seed, 1000, LLAMA2_TEMPLATE)
    cfg = LlamaConfig(vocab_size=shape["vocab"], hidden_size=shape["hidden"], intermediate_size=shape["ffn"],
                      num_hidden_layers=shape["n_layers"], num_attention_heads=shape["n_heads"],
                      num_key_value_heads=shape["n_kv_heads"], max_position_embeddings=4096,
                      tie_word_embeddings=False)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(str(directory))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    gen = torch.Generator().manual_seed(seed)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, meta in model.state_dict().items():
        n_in = meta.shape[-1]
        w = torch.randn(tuple(meta.shape), generator=gen, dtype=torch.float32)
        w = (1.0 + 0.2 * w) if name.endswith("norm.weight") else w / math.sqrt(n_in)
        w = w.to(torch.bfloat16)
        if size + w.numel() * 2 > shard_bytes and shards[-1]:
            shards.append({})
            size = 0
        shards[-1][name] = w
        size += w.numel() * 2
    weight_map = {}
    for k, part in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(part, str(directory / fname), metadata={"format": "pt"})
        weight_map.update({n: fname for n in part})
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def timed(cmd: list[str], env: dict | None = None) -> tuple[float, float]:
    """(seconds, peak RSS in GB) of a command (GNU time reports the RSS)."""
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M", *cmd], env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    rss = [int(x.split()[1]) for x in r.stderr.splitlines() if x.startswith("MAXRSS")]
    return dt, (rss[-1] / 1e6 if rss else float("nan"))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--params", type=float, default=1e9)
    p.add_argument("--dir", type=Path, default=Path("/tmp/muser-convert-speed"))
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--llama-quantize", default=os.environ.get(
        "MUSER_LLAMA_QUANTIZE", Path.home() / ".cache/muser-torch/peers/bin/llama-quantize"))
    args = p.parse_args()
    shape = llama_shape(args.params)
    ck = args.dir / f"llama-{args.params:.0e}"
    if not (ck / "model.safetensors.index.json").is_file():
        print(f"writing a random checkpoint {shape} to {ck}", flush=True)
        write_checkpoint(ck, shape)
    ck_bytes = sum(f.stat().st_size for f in ck.glob("*.safetensors"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(args.threads)}
    cli = [sys.executable, "-m", "muser_torch.cli", "convert", str(ck)]
    f16 = args.dir / "f16.gguf"
    if not f16.is_file():
        timed(cli + [str(f16), "--type", "f16", "--no-progress", "--threads", str(args.threads)], env)
    ours, theirs = args.dir / "ours-q4_k_m.gguf", args.dir / "llama-quantize-q4_k_m.gguf"
    have_peer = os.access(args.llama_quantize, os.X_OK)
    rows = []
    for _ in range(args.repeats):      # interleaved: the machine's load hits both alike
        t = timed(cli + [str(ours), "--type", "q4_k_m", "--device", args.device, "--no-progress",
                         "--threads", str(args.threads)], env)
        rows.append(("muser-torch convert --type q4_k_m", *t))
        if have_peer:
            t = timed([args.llama_quantize, str(f16), str(theirs), "Q4_K_M", str(args.threads)])
            rows.append(("llama-quantize F16 -> Q4_K_M", *t))
    print(f"checkpoint: {ck_bytes / 1e9:.2f} GB bf16 ({shape}), device {args.device}, {args.threads} threads")
    for name, t, rss in rows:
        print(f"{name:36s} {t:8.1f} s  {ck_bytes / t / 1e9:6.3f} GB/s  peak RSS {rss:.2f} GB")
    if have_peer:
        same = ours.read_bytes() == theirs.read_bytes()
        print(f"q4_k_m files byte-identical: {same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
