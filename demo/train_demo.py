"""Train the bundled demo Muse Glimmer on the Python standard library's own source.

Every machine with Python has this text, so the demo is reproducible
anywhere. Files are split by path (every 50th sorted file is held out), each
file becomes ``BOS bytes EOS``, and the model sees random 512-byte windows of
the concatenated training stream. One CPU thread, time-boxed:

    python demo/train_demo.py --minutes 48          # -> demo/build/demo_float.pt
    python demo/make_demo.py                        # -> the two GGUFs + perplexities

The float checkpoint stays in demo/build/ (ignored); only the GGUFs are committed.
"""
from __future__ import annotations

import argparse
import math
import sys
import sysconfig
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from muser_torch.arch.glimmer_recipe import QK_SCALE  # noqa: E402
from muser_torch.arch.muse_glimmer import GlimmerConfig, reference_pattern  # noqa: E402
from muser_torch.glimmer import Glimmer  # noqa: E402
from muser_torch.text.byte_tokenizer import ByteTokenizer  # noqa: E402

HERE = Path(__file__).resolve().parent
# The released architecture at toy size; logit_scale is the release's rule
# 1/sqrt(hidden / 256) (1 here), the softcap the release's 20.
DEMO_CONFIG = GlimmerConfig(
    context_length=512, hidden=256, ffn=768, n_layers=4, n_heads=2, n_kv_heads=1,
    head_dim=128, rms_eps=1e-6, sliding_window=64, sliding_window_pattern=reference_pattern(4),
    rope_base=10000.0, vocab_size=ByteTokenizer.VOCAB_SIZE, logit_scale=1.0, final_softcap=20.0,
    weight_precision="q4_k_xl")


def stdlib_files() -> tuple[list[Path], list[Path]]:
    """(train, held-out) .py files of the running interpreter's standard library."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py")
                   if "site-packages" not in p.parts and "dist-packages" not in p.parts)
    held = files[::50]
    held_set = set(held)
    return [p for p in files if p not in held_set], held


def token_stream(files: list[Path], tok: ByteTokenizer) -> torch.Tensor:
    ids: list[int] = []
    for p in files:
        ids += tok.encode(p.read_bytes(), bos=True, eos=True)
    return torch.tensor(ids, dtype=torch.long)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=45.0)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "build" / "demo_float.pt")
    ap.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)

    tok = ByteTokenizer()
    train_files, held_files = stdlib_files()
    train = token_stream(train_files, tok)
    print(f"{len(train_files)} train files ({train.numel():,} bytes), "
          f"{len(held_files)} held-out files", flush=True)

    model = Glimmer(DEMO_CONFIG)
    for name, p in model.named_parameters():  # small init; norms stay at one
        if p.dim() == 2:
            torch.nn.init.normal_(p, std=0.02 if "tok_embeddings" in name else 1 / math.sqrt(p.shape[1]))
        elif name.endswith("q_norm.weight"):   # the release's qk_scale_factor, as the converter writes it
            torch.nn.init.constant_(p, QK_SCALE)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    budget = args.minutes * 60
    warmup = 50
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start, step, last_save = time.time(), 0, time.time()
    while (elapsed := time.time() - start) < budget and step != args.max_steps:
        # cosine decay on wall time, so the schedule ends when the budget does
        frac = min(elapsed / budget, 1.0)
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.randint(0, train.numel() - args.seq - 1, (args.batch,))
        batch = torch.stack([train[s:s + args.seq + 1] for s in starts.tolist()])
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 20 == 0:
            print(f"step {step} {elapsed / 60:.1f} min loss {loss.item():.3f} "
                  f"({loss.item() / math.log(2):.2f} bits/byte) lr {lr:.2e}", flush=True)
        if time.time() - last_save > 300:
            torch.save({"config": DEMO_CONFIG, "state_dict": model.state_dict(), "steps": step}, args.out)
            last_save = time.time()
    torch.save({"config": DEMO_CONFIG, "state_dict": model.state_dict(), "steps": step,
                "minutes": (time.time() - start) / 60}, args.out)
    print(f"saved {args.out} after {step} steps", flush=True)


if __name__ == "__main__":
    main()
