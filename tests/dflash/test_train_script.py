"""``tools/train_dflash_drafter.py`` writes a file the loader reads as the
drafter it trained: a freshly randomized transformers
``MuseGlimmerAssistantModel`` of the script's shape (a 5-token window, so
the window is exercised), written by the script's ``write_draft`` for the
bundled demo, loaded with ``from_gguf(draft, target=demo)``; its first
round's logits against transformers' own forward of that model over the
same taps, block and lm_head."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

import muser_torch
from muser_torch.text.byte_tokenizer import ByteTokenizer

from .conftest import SEED
from .draft_files import assert_draft_logits_match, first_round

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "models" / "glimmer-demo-q4_k_xl.gguf"


def _script():
    spec = importlib.util.spec_from_file_location("train_dflash_drafter",
                                                  REPO / "tools" / "train_dflash_drafter.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@torch.no_grad()
def test_the_written_draft_computes_what_transformers_computes(tmp_path):
    script = _script()
    args = script.parse_args(["--out", str(tmp_path / "d.gguf"), "--type", "f32", "--window", "5",
                              "--seed", str(SEED % 1000)])
    args.dev = torch.device("cpu")
    target = muser_torch.from_gguf(DEMO, dtype=torch.float32)
    args.context = target.config.context_length
    model = script.assistant(args, target.config.hidden).eval()
    gen = torch.Generator().manual_seed(SEED)
    for name, p in model.named_parameters():     # fresh values (its init sets norms to 1)
        z = torch.randn(p.shape, generator=gen)
        p.copy_(1.0 + 0.2 * z if p.dim() == 1 else z / p.shape[-1] ** 0.5)
    embed = target.tok_embeddings.dequantize().float()
    lm_head = target.output.dequantize().float()
    script.write_draft(model, muser_torch.load_gguf(DEMO), args, target.config.hidden, embed.shape[0])
    draft = muser_torch.from_gguf(args.out, target=target)
    assert draft.tap_layers == args.tap_ids and draft.config.mask_token_id == ByteTokenizer.BOS

    ids = torch.randint(0, 256, (1, 23), generator=gen)
    got, tapped, anchor = first_round(target, draft, ids)
    block = torch.full((1, args.block), ByteTokenizer.BOS)
    block[0, 0] = anchor
    from transformers.cache_utils import DFlashCache
    cache = DFlashCache(config=model.config)           # as transformers' candidate generator calls it
    cache.set_previous_accepted_tokens(tapped.shape[1])
    h = model(noise_embeds=embed[block], context_hidden_states=tapped.float(), cache=cache).last_hidden_state
    assert_draft_logits_match(got, h[0, 1:] @ lm_head.T, (args.block - 1, embed.shape[0]), SEED)
