"""``tools/train_dflash_drafter.py``: its trainable drafter computes what
transformers' ``MuseGlimmerAssistantModel`` computes, and the file it writes
is loaded as that drafter. A fresh random drafter of the script's shape (a
5-token window, narrower than context + block, so the window is exercised)
for the bundled demo, its weights copied into transformers' class; the
script's forward and the loaded file's first round, each against
transformers' forward over the same taps, block and lm_head (called as its
DFlash candidate generator calls it, through a ``DFlashCache``)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import muser_torch
from muser_torch.text.byte_tokenizer import ByteTokenizer

from ..versions import require_transformers

from .conftest import SEED
from .draft_files import assert_draft_logits_match, assistant_config, first_round

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "demo" / "glimmer-demo-q4_k_xl.gguf"


def _script():
    spec = importlib.util.spec_from_file_location("train_dflash_drafter",
                                                  REPO / "tools" / "train_dflash_drafter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _transformers(model, args, hidden: int):
    """transformers' class of the same shape holding ``model``'s weights."""
    from transformers import MuseGlimmerAssistantModel
    cfg = assistant_config(hidden=hidden, ffn=args.ffn, n_layers=args.layers, n_heads=args.heads,
                           n_kv_heads=args.kv_heads, head_dim=args.head_dim, window=args.window,
                           tap_ids=args.tap_ids, mask=ByteTokenizer.BOS, block=args.block,
                           rope_theta=10000.0, rms_eps=1e-6, context=args.context)
    ref = MuseGlimmerAssistantModel(cfg).eval()
    missing, unexpected = ref.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("inv_freq" in m for m in missing), (missing, unexpected)
    return ref


def _reference_hidden(ref, noise: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    from transformers.cache_utils import DFlashCache
    cache = DFlashCache(config=ref.config)
    cache.set_previous_accepted_tokens(context.shape[1])
    return ref(noise_embeds=noise, context_hidden_states=context, cache=cache).last_hidden_state


@torch.no_grad()
def test_the_trainable_drafter_and_its_file_compute_what_transformers_computes(tmp_path):
    require_transformers("the MuseGlimmerAssistantModel reference")
    script = _script()
    args = script.parse_args(["--window", "5"])
    args.dev = torch.device("cpu")
    target = muser_torch.from_gguf(DEMO, dtype=torch.float32)
    args.context, hidden = target.config.context_length, target.config.hidden
    embed = target.tok_embeddings.dequantize().float()
    lm_head = target.output.dequantize().float()
    vocab = embed.shape[0]
    model = script.drafter(args, hidden, vocab).eval()
    gen = torch.Generator().manual_seed(SEED)
    for p in model.parameters():                  # fresh values (its init sets norms to 1)
        z = torch.randn(p.shape, generator=gen)
        p.copy_(1.0 + 0.2 * z if p.dim() == 1 else z / p.shape[-1] ** 0.5)
    ref = _transformers(model, args, hidden)

    ids = torch.randint(0, 256, (1, 23), generator=gen)
    path = tmp_path / "d.gguf"
    script.write_draft(model, muser_torch.load_gguf(DEMO), path, "f32")
    draft = muser_torch.from_gguf(path, target=target)
    assert draft.tap_layers == args.tap_ids and draft.config.mask_token_id == ByteTokenizer.BOS
    got, tapped, anchor = first_round(target, draft, ids)
    block = torch.full((1, args.block), ByteTokenizer.BOS)
    block[0, 0] = anchor
    want = _reference_hidden(ref, embed[block], tapped.float())[0, 1:] @ lm_head.T
    assert_draft_logits_match(got, want, (args.block - 1, vocab), SEED)

    # training's forward: two sequences' contexts, random blocks
    context = torch.cat((tapped, tapped.flip(1)))
    noise = embed[torch.randint(0, vocab, (2, args.block), generator=gen)]
    trained = model(noise, context) @ lm_head.T
    reference = _reference_hidden(ref, noise, context) @ lm_head.T
    for i in range(2):
        assert_draft_logits_match(trained[i], reference[i], (args.block, vocab), SEED)
