"""Small random DFlash drafts written the way llama.cpp's converter writes a
``dflash`` file (``conversion/qwen.py``'s DFlash path: the decoder keys,
``block_size``, ``target_layers`` = transformers' ``target_layer_ids`` + 1,
the window and its bool pattern, the target's vocabulary and the mask token;
tensors under the names of ``arch/dflash.py``'s table, nothing permuted or
shifted), and transformers' own ``MuseGlimmerAssistantModel`` and
``MuseGlimmerForConditionalGeneration`` holding the files' weights as
gguf-py's numpy code dequantizes them.

1. transformers' ``MuseGlimmerAssistantConfig`` / ``MuseGlimmerAssistantModel``
   (meta device) give the parameter names and shapes; values come from a
   seeded generator;
2. ggml's quantizer (libggml-python) packs every matrix in a type mix;
3. :func:`reference_draft` and :func:`reference_target` read the files back
   with gguf-py, undo nothing but the names, and load transformers' classes;
4. :func:`transformers_rounds` runs transformers' DFlash generation on them.

:func:`write_assistant_checkpoint` saves the same random drafter as a
transformers checkpoint (``save_pretrained``), the converter's input."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
import torch

from muser_torch.arch.dflash import ARCH, HF_NAMES, MASK_KEY
from muser_torch.gguf_io import save_gguf
from muser_torch.models.dflash import DraftContext
from muser_torch.models.taps import Taps

from ..glimmer.conftest import rel_err
from ..glimmer.muse_files import dequantized, reference_model
from ..models.hf_files import _quantized

DRAFT_MIX = ("Q8_0", "Q4_K", "F16", "Q6_K", "Q5_K", "BF16", "Q5_0")


def assistant_config(*, hidden: int = 256, ffn: int = 512, n_layers: int = 2, n_heads: int = 4,
                     n_kv_heads: int = 2, head_dim: int = 64, window: int = 5,
                     tap_ids: Sequence[int] = (0, 2, 3), mask: int = 317, block: int = 16,
                     rope_theta: float = 500000.0, rms_eps: float = 1e-5, context: int = 256):
    from transformers import MuseGlimmerAssistantConfig
    cfg = MuseGlimmerAssistantConfig(
        hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
        rms_norm_eps=rms_eps, sliding_window=window, max_position_embeddings=context,
        rope_parameters={"rope_type": "default", "rope_theta": rope_theta}, block_size=block,
        mask_token_id=mask, target_layer_ids=list(tap_ids), bos_token_id=None, eos_token_id=None,
        pad_token_id=None)
    cfg._attn_implementation = "eager"
    return cfg


def random_assistant(cfg, seed: int) -> dict[str, torch.Tensor]:
    """transformers-named float32 weights: norms near 1, projections over sqrt(fan-in)."""
    from transformers import MuseGlimmerAssistantModel
    with torch.device("meta"):
        model = MuseGlimmerAssistantModel(cfg)
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, t in model.state_dict().items():
        if "inv_freq" in name:
            continue
        z = torch.randn(tuple(t.shape), generator=gen)
        out[name] = (1.0 + 0.2 * z) if name.endswith("norm.weight") or name.endswith("norm_enc.weight") \
            else z / t.shape[-1] ** 0.5
    return out


def write_assistant_checkpoint(directory: "str | os.PathLike[str]", cfg, *, seed: int) -> Path:
    """``random_assistant`` saved by transformers (bfloat16, so a bf16
    conversion holds the checkpoint's values exactly)."""
    from transformers import MuseGlimmerAssistantModel
    model = MuseGlimmerAssistantModel(cfg)
    missing, unexpected = model.load_state_dict(random_assistant(cfg, seed), strict=False)
    assert not unexpected and all("inv_freq" in m for m in missing), (missing, unexpected)
    model.to(torch.bfloat16).save_pretrained(str(directory))
    return Path(directory)


def converter_metadata(cfg, vocab: int) -> dict[str, Any]:
    a = ARCH
    md = {
        "general.architecture": a, "general.name": "random dflash draft",
        f"{a}.block_count": cfg.num_hidden_layers, f"{a}.context_length": cfg.max_position_embeddings,
        f"{a}.embedding_length": cfg.hidden_size, f"{a}.feed_forward_length": cfg.intermediate_size,
        f"{a}.attention.head_count": cfg.num_attention_heads,
        f"{a}.attention.head_count_kv": cfg.num_key_value_heads,
        f"{a}.rope.freq_base": float(cfg.rope_parameters["rope_theta"]),
        f"{a}.attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps),
        f"{a}.attention.key_length": cfg.head_dim, f"{a}.attention.value_length": cfg.head_dim,
        f"{a}.block_size": cfg.block_size,
        f"{a}.target_layers": [i + 1 for i in cfg.target_layer_ids],
        f"{a}.attention.sliding_window": cfg.sliding_window,
        f"{a}.attention.sliding_window_pattern": [t == "sliding_attention" for t in cfg.layer_types],
        "tokenizer.ggml.model": "none", f"{a}.vocab_size": vocab, MASK_KEY: cfg.mask_token_id,
    }
    return md


def write_draft_gguf(path: "str | os.PathLike[str]", cfg, *, seed: int, vocab: int,
                     types: Sequence[str] = DRAFT_MIX,
                     edit: Callable[[dict, dict], None] | None = None) -> Path:
    """A random draft of ``cfg`` in the converter's layout, matrices quantized by ggml."""
    hf = random_assistant(cfg, seed)
    tensors: dict[str, Any] = {}
    k = 0
    for gguf_name, hf_name in HF_NAMES.items():
        for i in (range(cfg.num_hidden_layers) if "{i}" in gguf_name else [None]):
            w = hf[hf_name.format(i=i)]
            name = gguf_name.format(i=i)
            if w.dim() == 2:
                tensors[name] = _quantized(w, types[(k + seed) % len(types)])
                k += 1
            else:
                tensors[name] = ("F32", w.float())
    md = converter_metadata(cfg, vocab)
    if edit is not None:
        edit(md, tensors)
    save_gguf(path, md, tensors)
    return Path(path)


def reference_draft(path: "str | os.PathLike[str]", cfg):
    """transformers' MuseGlimmerAssistantModel holding the file's dequantized weights."""
    from transformers import MuseGlimmerAssistantModel
    w = dequantized(path)
    state = {}
    for gguf_name, hf_name in HF_NAMES.items():
        for i in (range(cfg.num_hidden_layers) if "{i}" in gguf_name else [None]):
            state[hf_name.format(i=i)] = w[gguf_name.format(i=i)]
    model = MuseGlimmerAssistantModel(cfg).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("inv_freq" in m for m in missing), (missing, unexpected)
    return model


def reference_target(path: "str | os.PathLike[str]", text_cfg):
    """transformers' MuseGlimmerForConditionalGeneration whose text model and
    lm_head hold the Muse Glimmer file's weights (``muse_files.reference_model``;
    its vision tower is a tiny random one the text never reaches)."""
    from transformers import MuseGlimmerConfig, MuseGlimmerForConditionalGeneration
    text = reference_model(path, text_cfg)
    cfg = MuseGlimmerConfig(text_config=text_cfg.to_dict(), tie_word_embeddings=False,
                            vision_config=dict(hidden_size=32, num_hidden_layers=1,
                                               intermediate_size=64, num_attention_heads=2),
                            out_hidden_size=32, projector_hidden_size=32)
    cfg._attn_implementation = "eager"
    cfg.text_config._attn_implementation = "eager"
    model = MuseGlimmerForConditionalGeneration(cfg).eval()
    model.model.language_model.load_state_dict(text.model.state_dict())
    model.lm_head.weight.data.copy_(text.lm_head.weight)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = None
    model.generation_config.bos_token_id = None
    return model


def transformers_rounds(target, draft, ids: torch.Tensor, n_new: int,
                        **inputs: Any) -> tuple[list[int], list[list]]:
    """transformers' DFlash generation, and per round with candidates:
    (candidate ids, their logits, accepted count). ``inputs`` go to ``generate``
    beside the ids (a vision prompt's ``pixel_values``, ``image_grid_thw``)."""
    from transformers.generation.candidate_generator import DFlashTokenCandidateGenerator
    rounds: list[list] = []
    get, update = DFlashTokenCandidateGenerator.get_candidates, \
        DFlashTokenCandidateGenerator.update_candidate_strategy

    def get_candidates(self, input_ids, *a, **kw):
        cand, logits = get(self, input_ids, *a, **kw)
        rounds.append([cand[0, input_ids.shape[1]:].tolist(), logits, None])
        return cand, logits

    def update_candidate_strategy(self, input_ids, scores, n_matches):
        rounds[-1][2] = int(n_matches)
        return update(self, input_ids, scores, n_matches)

    mp = pytest.MonkeyPatch()
    mp.setattr(DFlashTokenCandidateGenerator, "get_candidates", get_candidates)
    mp.setattr(DFlashTokenCandidateGenerator, "update_candidate_strategy", update_candidate_strategy)
    try:
        with torch.no_grad():
            out = target.generate(ids, assistant_model=draft, speculation_type="dflash",
                                  max_new_tokens=n_new, do_sample=False, **inputs)
    finally:
        mp.undo()
    return out[0, ids.shape[1]:].tolist(), [r for r in rounds if r[0]]


@torch.no_grad()
def first_round(target, draft, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    """muser_torch's first round after prompt ``ids``: (the draft's logits
    ``[block - 1, vocab]``, the tapped states it encoded, the anchor token)."""
    with Taps(target, draft.tap_layers) as taps:
        anchor = int(target(ids)[0, -1].argmax())
        tapped = taps.take()
    ctx = DraftContext()
    draft.extend(ctx, tapped)
    return draft.propose(ctx, anchor), tapped, anchor


def assert_draft_logits_match(got: torch.Tensor, want: torch.Tensor, shape: tuple[int, int],
                              seed: int) -> None:
    """Within 1e-4 relative of the reference, and the reference not degenerate."""
    err = rel_err(got, want)
    assert got.shape == want.shape == shape, (got.shape, want.shape, shape)
    assert err < 1e-4, f"relative error {err:.2e} against transformers (seed {seed})"
    assert float(want.std()) > 0.1, f"degenerate draft logits (seed {seed})"
