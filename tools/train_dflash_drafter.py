"""Train a DFlash drafter for the bundled demo Muse Glimmer and write it as a
``dflash`` GGUF that ``muser_torch.from_gguf(path, target=model)`` loads.

The data is the target's own greedy output: prompts are byte windows of the
demo's training text (the Python standard library's ``.py`` files, split as
``demo/train_demo.py`` splits them), the target continues each greedily,
and one forward over prompt + continuation records the tapped layers'
outputs. A training example is an anchor position ``p`` inside the
continuation: the context is the taps of positions ``0 .. p-1``, the block is
``[token p, MASK x (block-1)]`` embedded with the target's raw embedding,
the labels are the target's tokens ``p+1 .. p+block-1``, scored through the
target's lm_head (frozen, no logit scale, no soft-cap: what a draft round
computes). The trainable model is plain torch (``TrainableDrafter``; the
tests hold it to transformers' ``MuseGlimmerAssistantModel``), its weights
written under ``arch/dflash.py``'s names.

The demo's vocabulary (256 bytes, BOS, EOS) has no mask token; the drafter
uses BOS, which never occurs after a sequence's first position.

At the end the script loads the file it wrote, and on held-out prompts (the
held-out files) reports the mean accepted tokens per round and, in the same
run, greedy tok/s with and without the draft.

Smoke run (CPU, minutes):
    python tools/train_dflash_drafter.py --steps 20 --sequences 8 --new-tokens 48 --eval-prompts 2

Measure a drafter already written (here on the CPU, say):
    python tools/train_dflash_drafter.py --measure-only --out DRAFT.gguf --eval-prompts 8 --eval-tokens 256

Real run (the settings for a measurement of acceptance; CUDA):
    python tools/train_dflash_drafter.py --device cuda --sequences 2048 --gen-batch 256 --new-tokens 384 \\
        --steps 20000 --minutes 4 --batch 64 --lr 1e-3 --layers 2 --eval-prompts 8 \\
        --eval-tokens 256 --out demo/build/glimmer-demo-dflash.gguf
(--minutes bounds the training; the data and the measurement take minutes more.)
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
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "demo"))
import muser_torch  # noqa: E402
from muser_torch.arch.dflash import ARCH, HF_NAMES, DFlashConfig  # noqa: E402
from muser_torch.formats import GGMLType, quantize  # noqa: E402
from muser_torch.gguf_io import save_gguf  # noqa: E402
from muser_torch.models.taps import Taps  # noqa: E402
from muser_torch.text.byte_tokenizer import ByteTokenizer  # noqa: E402
from train_demo import stdlib_files  # noqa: E402

DEMO = REPO / "demo" / "glimmer-demo-q4_k_xl.gguf"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__[__doc__.index("Smoke run"):],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, default=DEMO, help="the target GGUF (default: the demo)")
    ap.add_argument("--out", type=Path, default=REPO / "demo" / "build" / "glimmer-demo-dflash.gguf")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sequences", type=int, default=64, help="prompts the target continues")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt bytes (BOS added)")
    ap.add_argument("--new-tokens", type=int, default=128, help="greedy tokens per prompt")
    ap.add_argument("--gen-batch", type=int, default=16, help="prompts generated together")
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--minutes", type=float, default=None,
                    help="stop training after this many minutes even if --steps are not done")
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
    ap.add_argument("--measure-only", action="store_true",
                    help="train nothing: measure the existing --out against --target")
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


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


class Attention(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden, c.q_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden, c.kv_dim, bias=False)
        self.o_proj = nn.Linear(c.q_dim, c.hidden, bias=False)
        self.q_norm, self.k_norm = RMSNorm(c.head_dim, c.rms_eps), RMSNorm(c.head_dim, c.rms_eps)

    def forward(self, x, context, cos, sin, mask):
        B, S, _ = x.shape
        kv = torch.cat((context, x), dim=1)
        q = self.q_norm(self.q_proj(x).view(B, S, -1, self.c.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(kv).view(B, kv.shape[1], -1, self.c.head_dim)).transpose(1, 2)
        v = self.v_proj(kv).view(B, kv.shape[1], -1, self.c.head_dim).transpose(1, 2)
        q, k = rotate(q, cos[-S:], sin[-S:]), rotate(k, cos, sin)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.c.head_dim ** -0.5,
                                             enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class MLP(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden, c.ffn, bias=False)
        self.up_proj = nn.Linear(c.hidden, c.ffn, bias=False)
        self.down_proj = nn.Linear(c.ffn, c.hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden, c.rms_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden, c.rms_eps)
        self.self_attn, self.mlp = Attention(c), MLP(c)

    def forward(self, x, context, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), context, cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Encoder(nn.Module):
    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.fc = nn.Linear(c.fc_in, c.hidden, bias=False)
        self.output_norm_enc = RMSNorm(c.hidden, c.rms_eps)


class TrainableDrafter(nn.Module):
    """The DFlash draft's forward in float, trainable. Its parameter names are
    transformers' MuseGlimmerAssistantModel's (``arch/dflash.py``'s
    ``HF_NAMES``), and tests/dflash/test_train_script.py holds its output to
    that class's. Each layer's block queries attend to the encoded context
    rows and the block's own rows, both ways within the window; RoPE in
    rotate-half order at absolute positions (context 0..n-1, block n..)."""

    def __init__(self, c: DFlashConfig):
        super().__init__()
        self.c = c
        self.encoder = Encoder(c)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.n_layers))
        self.norm = RMSNorm(c.hidden, c.rms_eps)
        dim = c.head_dim
        self.register_buffer("inv_freq", 1.0 / c.rope_base ** (torch.arange(0, dim, 2).float() / dim),
                             persistent=False)

    def forward(self, noise: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        """Final hidden states ``[B, block, hidden]`` of the embedded block
        ``noise`` after the target's tapped states ``context`` ``[B, n, taps x hidden]``."""
        n, S = context.shape[1], noise.shape[1]
        ctx = self.encoder.output_norm_enc(self.encoder.fc(context))
        pos = torch.arange(n + S, device=noise.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        x = noise
        for i, layer in enumerate(self.layers):
            window = self.c.window(i)
            mask = None if window is None else (pos[n:, None] - pos[None, :]).abs() <= window
            x = layer(x, ctx, cos, sin, mask)
        return self.norm(x)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE (the checkpoint's order: element i pairs with i + dim/2)."""
    a, b = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-b, a), dim=-1) * sin


def drafter_config(args, hidden: int, vocab: int) -> DFlashConfig:
    """The drafter's shape, as the file carries it."""
    return DFlashConfig(context_length=args.context, hidden=hidden, ffn=args.ffn, n_layers=args.layers,
                        n_heads=args.heads, n_kv_heads=args.kv_heads, head_dim=args.head_dim, rms_eps=1e-6,
                        sliding_window=args.window, rope_base=10000.0, block_size=args.block,
                        mask_token_id=ByteTokenizer.BOS, target_layers=tuple(i + 1 for i in args.tap_ids),
                        vocab_size=vocab, swa_layers=(True,) * args.layers)


def drafter(args, hidden: int, vocab: int) -> TrainableDrafter:
    """A fresh drafter: projections N(0, 0.02), norms 1."""
    torch.manual_seed(args.seed)
    model = TrainableDrafter(drafter_config(args, hidden, vocab))
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)
    return model.to(args.dev).train()


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
        if args.minutes is not None and time.perf_counter() - start > 60 * args.minutes:
            print(f"  stopped at step {step} of {args.steps}: --minutes {args.minutes} spent")
            break
        p = rng.randrange(first, L - args.block + 1)
        rows = torch.tensor(rng.sample(range(B), min(args.batch, B)), device=args.dev)
        block = seqs[rows, p:p + args.block]
        inputs = torch.full_like(block, ByteTokenizer.BOS)
        inputs[:, 0] = block[:, 0]
        h = model(embed[inputs], taps[rows, :p])
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


def write_draft(model: TrainableDrafter, target_file, path: Path, matrix_type: str) -> None:
    """The trained weights under ``arch/dflash.py``'s names, the dflash keys
    from ``DFlashConfig``, the target's tokenizer keys."""
    cfg = model.c
    md = cfg.to_metadata() | {"general.name": f"DFlash drafter for {target_file.path.name}"}
    types = {}
    for key, value in target_file.metadata.items():
        if key.startswith("tokenizer."):
            md[key], types[key] = value, target_file.metadata_types[key]
    del md[f"{ARCH}.vocab_size"]    # the tokens say it
    state = {n: t.detach().float().cpu() for n, t in model.state_dict().items()}
    tensors = {}
    for gguf_name, hf_name in HF_NAMES.items():
        for i in (range(cfg.n_layers) if "{i}" in gguf_name else [None]):
            w = state[hf_name.format(i=i)]
            if w.dim() == 1 or matrix_type == "f32":
                tensors[gguf_name.format(i=i)] = ("F32", w.contiguous())
            elif matrix_type == "f16":
                tensors[gguf_name.format(i=i)] = ("F16", w.half().contiguous())
            else:
                tensors[gguf_name.format(i=i)] = ("Q8_0", quantize(w, GGMLType.Q8_0),
                                                  tuple(reversed(w.shape)))
    path.parent.mkdir(parents=True, exist_ok=True)
    save_gguf(path, md, tensors, types=types)


@torch.no_grad()
def evaluate(target, files, args, rng) -> None:
    """On held-out prompts: mean accepted tokens per round, and greedy time
    with and without the draft in this run (prefill included, after one
    untimed run of each)."""
    draft = muser_torch.from_gguf(args.out, target=target)
    batch = prompts(files, args.eval_prompts, args.prompt_len, rng).to(args.dev)
    runs = {"plain": lambda ids: (target.generate(ids, args.eval_tokens, temperature=0.0), None),
            "draft": lambda ids: target.generate(ids, args.eval_tokens, temperature=0.0, draft=draft,
                                                 return_stats=True)}
    for run in runs.values():     # compiles and caches, untimed
        run(batch[0])
    seconds, outs, accepted, rounds = {"plain": 0.0, "draft": 0.0}, {}, 0, 0
    differ = 0
    for ids in batch:
        for name, run in runs.items():
            sync(args.dev)
            start = time.perf_counter()
            outs[name], stats = run(ids)
            sync(args.dev)
            seconds[name] += time.perf_counter() - start
        differ += not torch.equal(outs["plain"], outs["draft"])
        accepted, rounds = accepted + sum(stats.accepted), rounds + stats.rounds
    print(f"held-out: {args.eval_prompts} prompts x {args.eval_tokens} tokens, {rounds} rounds, "
          f"mean accepted {accepted / max(rounds, 1):.2f} tokens per round (+1 of the target's own); "
          f"greedy plain {seconds['plain']:.2f} s, with the draft {seconds['draft']:.2f} s "
          f"({seconds['plain'] / seconds['draft']:.2f}x, device {args.dev}, {target.activation_dtype})")
    if differ:
        print(f"ERROR: greedy output with the draft differs from the plain run on {differ} of "
              f"{len(batch)} prompts")
        raise SystemExit(1)


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
    # loaded as `muser-torch run` loads it (the device's default activation dtype)
    target = muser_torch.from_gguf(args.target, device=args.dev)
    c = target.config
    args.context = c.context_length
    if args.prompt_len + 1 + args.new_tokens > c.context_length:
        raise SystemExit(f"--prompt-len + 1 + --new-tokens exceeds the target's context {c.context_length}")
    if not all(0 <= i < c.n_layers - 1 for i in args.tap_ids):
        raise SystemExit(f"--taps {args.taps}: the target's {c.n_layers} layers take 0 .. {c.n_layers - 2}")
    train_files, held_files = stdlib_files()
    if args.measure_only:
        evaluate(target, held_files, args, rng)
        return 0
    print(f"target {args.target.name}: generating {args.sequences} x {args.new_tokens} greedy tokens")
    seqs, taps = target_data(target, train_files, args, rng)
    embed = target.tok_embeddings.dequantize().float().to(args.dev)   # raw: no norm, no scale
    lm_head = target.output.dequantize().float().to(args.dev)
    model = drafter(args, c.hidden, embed.shape[0])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"drafter: {args.layers} layers, {n_params:,} parameters; training {args.steps} steps")
    train(model, seqs, taps, embed, lm_head, args, rng)
    write_draft(model.eval(), target_file, args.out, args.type)
    print(f"wrote {args.out}")
    del seqs, taps
    evaluate(target, held_files, args, rng)
    return 0


if __name__ == "__main__":
    sys.exit(main())
