"""Train a DFlash drafter for the bundled demo Muse Glimmer and write it as a
``dflash`` GGUF that ``muser_torch.from_gguf(path, target=model)`` loads.

The data is the target's own greedy output: prompts are byte windows of the
demo's training text (the Python standard library's ``.py`` files, split as
``models/train_demo.py`` splits them), the target continues each greedily,
and one forward over prompt + continuation records the tapped layers'
outputs. A training example is an anchor position ``p`` inside the
continuation: the context is the taps of positions ``0 .. p-1``, the block is
``[token p, MASK x (block-1)]`` embedded with the target's raw embedding,
the labels are the target's tokens ``p+1 .. p+block-1``, scored through the
target's lm_head (frozen, no logit scale, no soft-cap: what a draft round
computes). The trainable model is transformers' ``MuseGlimmerAssistantModel``
(the [hf] extra), whose weights the file holds under ``arch/dflash.py``'s names.

The demo's vocabulary (256 bytes, BOS, EOS) has no mask token; the drafter
uses BOS, which never occurs after a sequence's first position.

At the end the script loads the file it wrote, and on held-out prompts (the
held-out files) reports the mean accepted tokens per round and, in the same
run, greedy tok/s with and without the draft.

Smoke run (CPU, minutes):
    python tools/train_dflash_drafter.py --steps 20 --sequences 8 --new-tokens 48 --eval-prompts 2

Real run (the settings for a measurement of acceptance; CUDA):
    python tools/train_dflash_drafter.py --device cuda --sequences 4096 --gen-batch 256 --new-tokens 384 \\
        --steps 20000 --batch 64 --lr 1e-3 --layers 2 --eval-prompts 16 --eval-tokens 256 \\
        --out models/build/glimmer-demo-dflash.gguf
"""
from __future__ import annotations

import argparse
import math
import random
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "models"))
import muser_torch  # noqa: E402
from muser_torch.arch.dflash import ARCH, HF_NAMES, DFlashConfig  # noqa: E402
from muser_torch.formats import GGMLType, quantize  # noqa: E402
from muser_torch.gguf_io import save_gguf  # noqa: E402
from muser_torch.models.speculative import Taps  # noqa: E402
from muser_torch.text.byte_tokenizer import ByteTokenizer  # noqa: E402
from train_demo import stdlib_files  # noqa: E402

DEMO = REPO / "models" / "glimmer-demo-q4_k_xl.gguf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__.split("\n\n")
    ap = argparse.ArgumentParser(description=doc[0], epilog="\n\n".join(doc[-2:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=DEMO, help="the target GGUF (default: the demo)")
    ap.add_argument("--out", type=Path, default=REPO / "models" / "build" / "glimmer-demo-dflash.gguf")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sequences", type=int, default=64, help="prompts the target continues")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt bytes (BOS added)")
    ap.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per prompt")
    ap.add_argument("--gen-batch", type=int, default=16, help="prompts generated together")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16, help="anchors per step")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--decay", type=float, default=7.0,
                    help="block position k's loss weight is exp(-(k-1)/decay): early candidates count more")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--window", type=int, default=128, help="bidirectional sliding window of every layer")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--taps", default="0,1,2", help="target layers whose outputs the draft reads")
    ap.add_argument("--type", choices=("f16", "q8_0", "f32"), default="f16", help="the matrices' type")
    ap.add_argument("--eval-prompts", type=int, default=8)
    ap.add_argument("--eval-tokens", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)
    args.tap_ids = tuple(int(x) for x in args.taps.split(","))
    for name in ("sequences", "prompt_len", "new_tokens", "gen_batch", "steps", "batch", "layers",
                 "heads", "kv_heads", "head_dim", "ffn", "window", "eval_prompts", "eval_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.block < 2 or args.new_tokens < args.block:
        ap.error(f"--block must be at least 2 and at most --new-tokens ({args.new_tokens})")
    return args


def prompts(files: list[Path], n: int, length: int, rng: random.Random) -> torch.Tensor:
    """``n`` prompts ``[BOS, length bytes]`` from random places in ``files``."""
    tok, out = ByteTokenizer(), []
    while len(out) < n:
        data = rng.choice(files).read_bytes()
        if len(data) > length:
            start = rng.randrange(len(data) - length)
            out.append(tok.encode(data[start:start + length]))
    return torch.tensor(out, dtype=torch.long)


@torch.no_grad()
def target_data(target, files, args, rng) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids ``[N, L]``: prompts and the target's greedy continuations,
    tapped outputs ``[N, L, taps x hidden]``)."""
    seqs, taps = [], []
    for i in range(0, args.sequences, args.gen_batch):
        ids = prompts(files, min(args.gen_batch, args.sequences - i), args.prompt_len, rng).to(args.dev)
        seq = target.generate(ids, args.new_tokens, temperature=0.0, stop=[])
        with Taps(target, args.tap_ids) as t:
            target(seq)
            taps.append(t.take().float())
        seqs.append(seq)
        print(f"  target data: {i + len(ids)}/{args.sequences} sequences", flush=True)
    return torch.cat(seqs), torch.cat(taps)


def assistant(args, hidden: int):
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
    cfg = MuseGlimmerAssistantConfig(
        hidden_size=hidden, intermediate_size=args.ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.kv_heads, head_dim=args.head_dim,
        rms_norm_eps=1e-6, sliding_window=args.window, max_position_embeddings=args.context,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, block_size=args.block,
        mask_token_id=ByteTokenizer.BOS, target_layer_ids=list(args.tap_ids),
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    return MuseGlimmerAssistantModel(cfg).to(args.dev).train()


def draft_forward(model, noise: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """The block's final hidden states ``[B, block, hidden]``, called as
    transformers' DFlash candidate generator calls the model: through a
    ``DFlashCache`` told of the context rows, so that the sliding-window mask
    spans context and block (without it the mask covers the block alone)."""
    from transformers.cache_utils import DFlashCache
    cache = DFlashCache(config=model.config)
    cache.set_previous_accepted_tokens(context.shape[1])
    return model(noise_embeds=noise, context_hidden_states=context, cache=cache).last_hidden_state


def train(model, seqs, taps, embed, lm_head, args, rng) -> None:
    """AdamW, cosine decay, one anchor position per step shared by its batch."""
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * s / args.steps)))
    B, L = seqs.shape
    k = torch.arange(1, args.block, device=args.dev, dtype=torch.float32)
    weight = torch.exp(-(k - 1) / args.decay)
    first = args.prompt_len + 1          # positions from here on are the target's own tokens
    start = time.perf_counter()
    for step in range(args.steps):
        p = rng.randrange(first, L - args.block + 1)
        rows = torch.tensor(rng.sample(range(B), min(args.batch, B)), device=args.dev)
        block = seqs[rows, p:p + args.block]
        inputs = torch.full_like(block, ByteTokenizer.BOS)
        inputs[:, 0] = block[:, 0]
        h = draft_forward(model, embed[inputs], taps[rows, :p])
        logits = h[:, 1:] @ lm_head.T
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), block[:, 1:].reshape(-1),
                             reduction="none").view(len(rows), -1)
        loss = (ce * weight).sum(1).mean() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % max(1, args.steps // 20) == 0 or step == args.steps - 1:
            top1 = (logits.argmax(-1) == block[:, 1:]).float().mean(0)
            print(f"  step {step + 1}/{args.steps}: loss {loss.item():.4f}, top-1 at block rows 1/4/15 "
                  f"{top1[0]:.2f}/{top1[min(3, len(top1) - 1)]:.2f}/{top1[-1]:.2f} "
                  f"({time.perf_counter() - start:.0f} s)", flush=True)


def write_draft(model, target_file, args, hidden: int, vocab: int) -> None:
    """The trained weights under ``arch/dflash.py``'s names, the dflash keys
    from ``DFlashConfig``, the target's tokenizer keys."""
    c = model.config
    cfg = DFlashConfig(context_length=args.context, hidden=hidden, ffn=c.intermediate_size,
                       n_layers=c.num_hidden_layers, n_heads=c.num_attention_heads,
                       n_kv_heads=c.num_key_value_heads, head_dim=c.head_dim, rms_eps=c.rms_norm_eps,
                       sliding_window=c.sliding_window, rope_base=10000.0, block_size=c.block_size,
                       mask_token_id=c.mask_token_id, target_layers=tuple(i + 1 for i in c.target_layer_ids),
                       vocab_size=vocab, swa_layers=(True,) * c.num_hidden_layers)
    md = cfg.to_metadata() | {"general.name": f"DFlash drafter for {target_file.path.name}"}
    types = {}
    for key, value in target_file.metadata.items():
        if key.startswith("tokenizer."):
            md[key], types[key] = value, target_file.metadata_types[key]
    del md[f"{ARCH}.vocab_size"]    # the tokens say it
    state = {n: t.detach().float().cpu() for n, t in model.state_dict().items()}
    tensors = {}
    for gguf_name, hf_name in HF_NAMES.items():
        for i in (range(c.num_hidden_layers) if "{i}" in gguf_name else [None]):
            w = state[hf_name.format(i=i)]
            if w.dim() == 1 or args.type == "f32":
                tensors[gguf_name.format(i=i)] = ("F32", w.contiguous())
            elif args.type == "f16":
                tensors[gguf_name.format(i=i)] = ("F16", w.half().contiguous())
            else:
                tensors[gguf_name.format(i=i)] = ("Q8_0", quantize(w, GGMLType.Q8_0), tuple(reversed(w.shape)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    save_gguf(args.out, md, tensors, types=types)


@torch.no_grad()
def evaluate(target, files, args, rng) -> None:
    """Mean accepted tokens per round on held-out prompts; greedy tok/s with
    and without the draft, in this run (prefill included)."""
    draft = muser_torch.from_gguf(args.out, target=target)
    accepted, rounds, t_plain, t_draft = 0, 0, 0.0, 0.0
    for ids in prompts(files, args.eval_prompts, args.prompt_len, rng):
        ids = ids.to(args.dev)
        for name in ("plain", "draft"):
            sync(args.dev)
            start = time.perf_counter()
            if name == "plain":
                plain = target.generate(ids, args.eval_tokens, temperature=0.0)
            else:
                out, stats = target.generate(ids, args.eval_tokens, temperature=0.0, draft=draft,
                                             return_stats=True)
            sync(args.dev)
            elapsed = time.perf_counter() - start
            if name == "plain":
                t_plain += elapsed
            else:
                t_draft += elapsed
        if not torch.equal(out, plain):
            raise AssertionError("greedy output with the draft differs from the plain run")
        accepted, rounds = accepted + sum(stats.accepted), rounds + stats.rounds
    print(f"held-out: {args.eval_prompts} prompts x {args.eval_tokens} tokens, {rounds} rounds, "
          f"mean accepted {accepted / max(rounds, 1):.2f} tokens per round (+1 of the target's own); "
          f"greedy plain {t_plain:.2f} s, with the draft {t_draft:.2f} s ({t_plain / t_draft:.2f}x, "
          f"device {args.dev})")


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    args.dev = torch.device(args.device)
    rng = random.Random(args.seed)
    target_file = muser_torch.load_gguf(args.target)
    target = muser_torch.from_gguf(args.target, device=args.dev, dtype=torch.float32)
    c = target.config
    args.context = c.context_length
    if args.prompt_len + 1 + args.new_tokens > c.context_length:
        raise SystemExit(f"--prompt-len + 1 + --new-tokens exceeds the target's context {c.context_length}")
    if not all(0 <= i < c.n_layers - 1 for i in args.tap_ids):
        raise SystemExit(f"--taps {args.taps}: the target's {c.n_layers} layers take 0 .. {c.n_layers - 2}")
    train_files, held_files = stdlib_files()
    print(f"target {args.target.name}: generating {args.sequences} x {args.new_tokens} greedy tokens")
    seqs, taps = target_data(target, train_files, args, rng)
    embed = target.tok_embeddings.dequantize().float().to(args.dev)   # raw: no norm, no scale
    lm_head = target.output.dequantize().float().to(args.dev)
    model = assistant(args, c.hidden)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"drafter: {args.layers} layers, {n_params:,} parameters; training {args.steps} steps")
    train(model, seqs, taps, embed, lm_head, args, rng)
    write_draft(model.eval(), target_file, args, c.hidden, embed.shape[0])
    print(f"wrote {args.out}")
    evaluate(target, held_files, args, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
