"""A tiny random ``MuseGlimmerForConditionalGeneration`` checkpoint with a
working vision tower (float32 safetensors, the transformers config, a byte
BPE tokenizer that holds the processor's image and video tokens), and the
two files llama.cpp's own converter writes from it: the text GGUF and the
``--mmproj`` GGUF."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch

from ..convert.checkpoints import save_weights, write_byte_bpe
from ..convert.peers import run_converter

# The processor's marker tokens (transformers' MuseGlimmerProcessor).
MARKERS = ("<|patch|>", "<|image_start|>", "<|image_end|>", "<|video|>", "<|vid_frame_separator|>",
           "<|vid_start|>", "<|vid_end|>", "<|eot|>")


# The pre-tokenizer llama.cpp's converter is told the checkpoint has (``run_converter``'s "pre").
PRE = "qwen2"


def _add_markers(directory: Path) -> dict[str, int]:
    """The processor's tokens added, and the split of ``PRE`` as the pre-tokenizer,
    so that transformers' tokenizer of the checkpoint and the converted file's
    split text alike (a video block's ``Time: 1.0s`` holds digits, which
    GPT-2's split keeps with the space before them and Qwen2's does not)."""
    from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS
    tok = Tokenizer.from_file(str(directory / "tokenizer.json"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZER_SPLITS[PRE]), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in MARKERS])
    tok.save(str(directory / "tokenizer.json"))
    return {t: tok.token_to_id(t) for t in MARKERS}


def vision_glimmer_config(vocab: int, ids: dict[str, int], *, vision_layers: int = 5, **vision: Any):
    """A MuseGlimmerConfig: 4 text layers, and a vision tower of ``vision_layers``
    (window attention but on every 4th and the last) over a 4 x 4 position
    table, so images wider than 4 patches cross windows and resample it. Every
    matrix but the patch kernel has rows of a multiple of 256 inputs, so the
    mmproj can hold K-quants."""
    from transformers.models.muse_glimmer.configuration_muse_glimmer import MuseGlimmerConfig
    text = dict(vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                max_position_embeddings=512, rms_norm_eps=1e-6, sliding_window=96,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                qk_scale_factor=3.87, output_multiplier=0.4, final_logit_softcapping=20.0,
                bos_token_id=None, eos_token_id=None)
    v = dict(hidden_size=256, intermediate_size=256, num_hidden_layers=vision_layers, num_attention_heads=4,
             pos_emb_height=4, pos_emb_width=4, max_position_embeddings=16,
             rope_parameters={"rope_type": "axial", "rope_theta": 10000.0}, **vision)
    cfg = MuseGlimmerConfig(text_config=text, vision_config=v, out_hidden_size=256 * 4,
                            projector_hidden_size=256, image_token_id=ids["<|patch|>"],
                            video_token_id=ids["<|video|>"])
    cfg.architectures = ["MuseGlimmerForConditionalGeneration"]
    return cfg


def write_preprocessor_config(directory: Path) -> None:
    """preprocessor_config.json with MuseGlimmerImageProcessor's defaults (the
    converter copies image_mean / image_std into the mmproj). Written by hand:
    the processor class needs torchvision to be built."""
    from transformers.utils.constants import IMAGENET_STANDARD_MEAN, IMAGENET_STANDARD_STD
    (directory / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "MuseGlimmerImageProcessor", "image_mean": list(IMAGENET_STANDARD_MEAN),
        "image_std": list(IMAGENET_STANDARD_STD), "patch_size": 14, "temporal_patch_size": 2,
        "merge_size": 2, "max_image_tokens": 4096, "resample": 1, "rescale_factor": 1 / 255,
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True}))


def write_vision_checkpoint(directory: Path, seed: int, **config: Any) -> tuple[Path, Any]:
    """The checkpoint (float32 values that F16 holds exactly) and its config."""
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerForConditionalGeneration
    directory.mkdir(parents=True, exist_ok=True)
    write_byte_bpe(directory, seed, 400)
    ids = _add_markers(directory)
    from tokenizers import Tokenizer
    n_tok = Tokenizer.from_file(str(directory / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    cfg = vision_glimmer_config(n_tok, ids, **config)
    cfg.save_pretrained(str(directory))
    write_preprocessor_config(directory)
    with torch.device("meta"):
        model = MuseGlimmerForConditionalGeneration(cfg)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, meta in model.state_dict().items():
        z = torch.randn(tuple(meta.shape), generator=gen)
        if name.endswith("layernorm.weight"):      # centered: the text model uses 1 + w
            w = 0.2 * z
        elif name.endswith(("norm.weight", "norm1.weight", "norm2.weight", "ln_pre.weight",
                            "ln_post.weight")):
            w = 1.0 + 0.2 * z
        elif name.endswith("embed_tokens.weight") or name.endswith("position_embedding_table.weight"):
            w = z
        elif meta.dim() < 2:
            w = 0.1 * z
        elif name == "lm_head.weight":
            w = 8.0 * z / math.sqrt(meta.shape[1])
        else:
            w = z / math.sqrt(meta.shape[-1])
        # values an F16 file holds exactly, so transformers reading the checkpoint and
        # muser-torch reading llama.cpp's F16 files hold the same weights
        weights[name] = w.half().float().contiguous()
    # The markers' lm_head rows are zero (logit 0, below the best of 400 random logits), so
    # greedy decoding never emits a placeholder: transformers embeds a placeholder id as token
    # 0's row (MuseGlimmerModel.forward), llama.cpp and muser-torch as its own row.
    weights["lm_head.weight"][list(ids.values())] = 0.0
    save_weights(directory, weights)
    return directory, cfg


def convert_with_llama_cpp(checkpoint: Path, text_out: Path, mmprojs: dict[str, Path],
                           outtype: str = "f16") -> None:
    """llama.cpp's release converter (tools/peers.sh): the text file in ``outtype``, then
    ``--mmproj`` once per ``{type: path}`` of ``mmprojs``, all in one converter process."""
    run_converter([{"dir": checkpoint, "out": text_out, "outtype": outtype, "pre": PRE}]
                  + [{"dir": checkpoint, "out": path, "outtype": kind, "pre": PRE, "extra": ["--mmproj"]}
                     for kind, path in mmprojs.items()], text_out.parent, release=True)


def _permute_back(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo the converter's un-permutation of q/k (adjacent pairs back to rotate-half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def reference_model(checkpoint: Path, mmproj: Path):
    """transformers' MuseGlimmerForConditionalGeneration (float32, eager) from the
    checkpoint, its vision tower, adapter and projection holding the mmproj's
    weights dequantized by gguf-py (the converter's edits undone; the summed
    patch kernel split into two equal temporal halves, which an image -- its
    frame repeated over the temporal patch -- cannot tell from the original)."""
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerForConditionalGeneration
    from ..glimmer.muse_files import dequantized
    model = MuseGlimmerForConditionalGeneration.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager").eval()
    for k in ("eos_token_id", "pad_token_id", "bos_token_id"):
        setattr(model.generation_config, k, None)
    vc = model.config.vision_config
    w = dequantized(mmproj)
    hf = {"model.vision_adapter.fc1.weight": w["mm.0.weight"], "model.vision_adapter.fc2.weight": w["mm.1.weight"],
          "model.vision_projection.weight": w["mm.2.weight"]}
    half = w["v.patch_embd.weight"].reshape(vc.hidden_size, -1) / 2
    hf["model.vision_tower.patch_embedder.patch_embedding.weight"] = torch.cat((half, half), dim=1)
    hf["model.vision_tower.patch_embedder.position_embedding_table.weight"] = w["v.position_embd.weight"]
    for ours, theirs in (("pre_ln", "ln_pre"), ("post_ln", "ln_post")):
        for x in ("weight", "bias"):
            hf[f"model.vision_tower.{theirs}.{x}"] = w[f"v.{ours}.{x}"].reshape(-1)
    names = {"ln1": "norm1", "ln2": "norm2", "attn_q": "attn.q_proj", "attn_k": "attn.k_proj",
             "attn_v": "attn.v_proj", "attn_out": "attn.proj", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}
    for il in range(vc.num_hidden_layers):
        for ours, theirs in names.items():
            for x in ("weight", "bias"):
                t = w[f"v.blk.{il}.{ours}.{x}"]
                t = t.reshape(-1) if x == "bias" or ours.startswith("ln") else t
                if ours in ("attn_q", "attn_k"):
                    t = _permute_back(t, vc.num_attention_heads)
                hf[f"model.vision_tower.layers.{il}.{theirs}.{x}"] = t
    state = model.state_dict()
    for name, t in hf.items():
        assert state[name].shape == t.shape, (name, state[name].shape, t.shape)
        state[name].copy_(t)
    return model


KQUANTS = ("Q4_K", "Q5_K", "Q6_K")


def requantize_mmproj(src: Path, dst: Path) -> Path:
    """A copy of an F16 mmproj whose matrices (all but the patch kernel) ggml
    re-quantizes (libggml-python), cycling through Q4_K, Q5_K and Q6_K: the
    K-quant file llama.cpp's quantizer would make of it, type for type."""
    from muser_torch.gguf_io import load_gguf, save_gguf
    from ..formats.ggml_ref import lib
    from ..models.hf_files import _quantized
    lib()
    g = load_gguf(src)
    tensors: dict[str, Any] = {}
    k = 0
    for name, t in g.tensors.items():
        if t.type_name == "F16" and len(t.ne) == 2 and t.n_in % 256 == 0:
            _, packed, ne = _quantized(g.dequantize(name), KQUANTS[k % len(KQUANTS)])
            tensors[name] = (KQUANTS[k % len(KQUANTS)], torch.as_tensor(packed), ne)
            k += 1
        else:
            tensors[name] = t
    save_gguf(dst, dict(g.metadata), tensors, types=dict(g.metadata_types))
    return dst
