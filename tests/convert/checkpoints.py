"""Small random Hugging Face checkpoints, written as a hub download looks: config.json
from transformers' own config class, safetensors weights (optionally sharded
with model.safetensors.index.json), and a real tokenizer trained here
(sentencepiece's ``tokenizer.model`` for Llama and Gemma 3, each with its
family's settings, a byte-level BPE
``tokenizer.json`` for the Qwens) with its ``tokenizer_config.json`` and chat
template. Weights are ``hf_files.random_hf_weights`` (transformers' parameter
names and shapes, fresh values from a seed)."""
from __future__ import annotations

import io
import json
import math
from pathlib import Path
from typing import Any

import torch

from ..models.hf_files import random_hf_weights
from ..text.tiny_tokenizers import CHATML_TEMPLATE, GEMMA_TEMPLATE, LLAMA2_TEMPLATE, corpus

ARCHS = ("llama", "qwen2", "qwen3", "gemma3")
HF_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
           "gemma3": "Gemma3ForCausalLM"}


def hf_config(arch: str, *, vocab: int, n_layers: int = 2, hidden: int = 256, ffn: int = 512,
              n_heads: int = 4, n_kv_heads: int = 2, head_dim: int | None = None, tied: bool = False,
              rope: dict | None = None, **extra: Any):
    from transformers import Gemma3TextConfig, LlamaConfig, Qwen2Config, Qwen3Config
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "gemma3": Gemma3TextConfig}[arch]
    kw: dict[str, Any] = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn,
                              num_hidden_layers=n_layers, num_attention_heads=n_heads,
                              num_key_value_heads=n_kv_heads, max_position_embeddings=512,
                              tie_word_embeddings=tied, **extra)
    if head_dim is not None:
        kw["head_dim"] = head_dim
    if arch == "gemma3":   # as the releases have it (the 27B aside): the file has no key for it
        kw.setdefault("query_pre_attn_scalar", head_dim or cls().head_dim)
    if rope is not None:
        kw["rope_parameters"] = rope
    cfg = cls(**kw)
    cfg.architectures = [HF_ARCH[arch]]
    return cfg


# sentencepiece settings and tokenizer_config.json of the two sentencepiece
# families: Llama's (a dummy space prefix; <unk> <s> </s>) and Gemma's (no
# prefix; <pad> <eos> <bos> <unk>, then control tokens such as <mask> and the
# turn markers)
_SPM = {
    "llama": (dict(add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1),
              {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
               "tokenizer_class": "LlamaTokenizer", "chat_template": LLAMA2_TEMPLATE}),
    "gemma3": (dict(add_dummy_prefix=False, pad_id=0, eos_id=1, bos_id=2, unk_id=3,
                    pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>", unk_piece="<unk>",
                    control_symbols=["<mask>", "<start_of_turn>", "<end_of_turn>"]),
               {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>",
                "pad_token": "<pad>", "mask_token": "<mask>", "tokenizer_class": "GemmaTokenizer",
                "chat_template": GEMMA_TEMPLATE}),
}


def write_sentencepiece(directory: Path, seed: int, vocab: int, family: str = "llama") -> int:
    """tokenizer.model (sentencepiece BPE with byte fallback, ``family``'s settings:
    "llama" or "gemma3") and tokenizer_config.json; returns the piece count."""
    import sentencepiece as spm
    settings, config = _SPM[family]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(seed)), model_writer=model, model_type="bpe",
        vocab_size=vocab, byte_fallback=True, character_coverage=0.98,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, split_digits=True, minloglevel=2, **settings)
    (directory / "tokenizer.model").write_bytes(model.getvalue())
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {**config, "add_bos_token": True, "add_eos_token": False}))
    return vocab


def write_byte_bpe(directory: Path, seed: int, vocab: int, lowercase: bool = False) -> int:
    """tokenizer.json (byte-level BPE, Qwen-style specials; ``lowercase``: an
    NFC + Lowercase normalizer) and tokenizer_config.json; returns the token count."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    if lowercase:
        tok.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed), trainer)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<think>", "</think>")])
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "add_bos_token": False, "chat_template": CHATML_TEMPLATE,
        "tokenizer_class": "PreTrainedTokenizerFast"}))
    return tok.get_vocab_size(with_added_tokens=True)


def save_weights(directory: Path, weights: dict[str, torch.Tensor], shards: int = 1) -> None:
    """model.safetensors, or ``shards`` parts with model.safetensors.index.json."""
    from safetensors.torch import save_file
    names = list(weights)
    if shards == 1:
        save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for k in range(shards):
        part = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        chunk = {n: weights[n] for n in names[k::shards]}
        save_file(chunk, str(directory / part), metadata={"format": "pt"})
        weight_map.update({n: part for n in chunk})
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


def write_checkpoint(directory: Path, arch: str, seed: int, *, dtype: torch.dtype = torch.bfloat16,
                     shards: int = 1, vocab: int = 512, extra_vocab: int = 0, lowercase: bool = False,
                     **config: Any) -> tuple[Path, Any, dict[str, torch.Tensor]]:
    """A random ``arch`` checkpoint in ``directory``: (directory, config, weights as saved).
    ``extra_vocab`` rows beyond the tokenizer (the converter pads or trims them)."""
    directory.mkdir(parents=True, exist_ok=True)
    if arch in ("llama", "gemma3"):
        n_tok = write_sentencepiece(directory, seed, vocab, arch)
    else:
        n_tok = write_byte_bpe(directory, seed, vocab, lowercase)
    cfg = hf_config(arch, vocab=n_tok + extra_vocab, **config)
    cfg.save_pretrained(str(directory))
    weights = {k: v.to(dtype).contiguous() for k, v in random_hf_weights(cfg, seed).items()}
    save_weights(directory, weights, shards)
    return directory, cfg, weights


# Linear layers a ModelOpt NVFP4 export quantizes (the lm_head and embedding stay 16-bit).
NVFP4_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def nvfp4_parts(n_out: int, n_in: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A ModelOpt NVFP4 linear's tensors: packed E2M1 codes (any byte), E4M3FN
    scales of either sign over several binades (no NaN codes), a positive
    float32 scale_2 and an input_scale."""
    payload = torch.randint(0, 256, (n_out, n_in // 2), dtype=torch.uint8, generator=gen)
    mag = torch.randint(0x08, 0x60, (n_out, n_in // 16), dtype=torch.uint8, generator=gen)
    sign = torch.randint(0, 2, (n_out, n_in // 16), dtype=torch.uint8, generator=gen) << 7
    scale_2 = torch.rand((), generator=gen) * 0.01 + 1e-3
    return {"weight": payload, "weight_scale": (mag | sign).view(torch.float8_e4m3fn),
            "weight_scale_2": scale_2.to(torch.float32), "input_scale": torch.tensor(0.5)}


def write_nvfp4_checkpoint(directory: Path, arch: str, seed: int, **config: Any
                           ) -> tuple[Path, Any, dict[str, torch.Tensor]]:
    """A random checkpoint in ModelOpt's NVFP4 layout: every linear of the
    text layers packed, the rest bf16; config.json carries its
    quantization_config. ``arch`` "muse-glimmer" writes a Muse Glimmer."""
    if arch == "muse-glimmer":
        d, cfg, weights = write_glimmer_checkpoint(directory, seed, **config)
    else:
        d, cfg, weights = write_checkpoint(directory, arch, seed, **config)
    gen = torch.Generator().manual_seed(seed + 17)
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        if name.endswith(".weight") and name.split(".")[-2] in NVFP4_LINEARS and "vision" not in name:
            base = name[:-len(".weight")]
            for k, v in nvfp4_parts(w.shape[0], w.shape[1], gen).items():
                out[f"{base}.{k}"] = v
        else:
            out[name] = w
    for p in d.glob("model*.safetensors*"):
        p.unlink()
    save_weights(d, out)
    raw = json.loads((d / "config.json").read_text())
    raw["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                  "exclude_modules": ["lm_head"]}
    (d / "config.json").write_text(json.dumps(raw))
    return d, cfg, out


def glimmer_config(vocab: int, *, n_layers: int = 5, hidden: int = 256, ffn: int = 512, n_heads: int = 4,
                   n_kv_heads: int = 2, head_dim: int = 64, window: int = 6):
    """MuseGlimmerConfig: a small text model and a tiny vision tower (which the
    converter leaves out)."""
    from transformers.models.muse_glimmer.configuration_muse_glimmer import MuseGlimmerConfig
    text = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=n_layers,
                num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, head_dim=head_dim,
                max_position_embeddings=256, rms_norm_eps=1e-6, sliding_window=window,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                qk_scale_factor=3.87, output_multiplier=0.4, final_logit_softcapping=20.0,
                bos_token_id=None, eos_token_id=None)
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                  pos_emb_height=4, pos_emb_width=4, max_position_embeddings=16)
    cfg = MuseGlimmerConfig(text_config=text, vision_config=vision, out_hidden_size=32,
                            projector_hidden_size=32)
    cfg.architectures = ["MuseGlimmerForConditionalGeneration"]
    return cfg


def write_glimmer_checkpoint(directory: Path, seed: int, *, dtype: torch.dtype = torch.bfloat16,
                             **config: Any) -> tuple[Path, Any, dict[str, torch.Tensor]]:
    """A random MuseGlimmerForConditionalGeneration checkpoint (text model with
    its centered norms' w around 0, untied lm_head, a tiny vision tower) and a
    byte-level BPE tokenizer."""
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerForConditionalGeneration
    directory.mkdir(parents=True, exist_ok=True)
    n_tok = write_byte_bpe(directory, seed, 512)
    cfg = glimmer_config(n_tok, **config)
    cfg.save_pretrained(str(directory))
    with torch.device("meta"):
        model = MuseGlimmerForConditionalGeneration(cfg)
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for name, meta in model.state_dict().items():
        z = torch.randn(tuple(meta.shape), generator=gen)
        if name.endswith("layernorm.weight"):      # centered: the model uses 1 + w
            w = 0.2 * z
        elif name.endswith("norm.weight") or name.endswith(("norm1.weight", "norm2.weight")):
            w = 1.0 + 0.2 * z
        elif name.endswith("embed_tokens.weight") or meta.dim() < 2:
            w = z if meta.dim() == 2 else 0.1 * z
        elif name == "lm_head.weight":
            w = 8.0 * z / math.sqrt(meta.shape[1])
        else:
            w = z / math.sqrt(meta.shape[-1])
        weights[name] = w.to(dtype).contiguous()
    save_weights(directory, weights)
    return directory, cfg, weights
