"""Small real tokenizers, trained here, written as llama.cpp writes them into GGUF metadata.

- ``gpt2_metadata``: a byte-level BPE (``tokenizer.ggml.model = "gpt2"``), Qwen2
  style by default: the ``pre`` regex, ChatML special tokens, a ChatML template.
- ``llama_metadata``: a sentencepiece-style BPE (``"llama"``) with byte fallback:
  ``<unk> <s> </s>``, the 256 ``<0xNN>`` byte tokens, then pieces, with scores
  and token types, and a Llama-2 style template.
- ``sentencepiece_llama_metadata``: the same kind of vocabulary trained by
  sentencepiece itself, converted the way llama.cpp's converter does; the
  returned ``SentencePieceProcessor`` is then an independent reference.

Each returns only ``tokenizer.*`` keys. A GGUF that transformers'
``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` loads needs
``general.architecture`` besides (``write_tokenizer_gguf`` adds it; a model
writer adds its own keys and tensors next to these).

Vocabularies are trained with the ``tokenizers`` library on text drawn from a
seed, so a seed replays one exactly.
"""
from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from ..versions import require_transformers

# llama.cpp token types
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
SPACE = "\u2581"

CHATML_TEMPLATE = """{% if messages[0]['role'] != 'system' %}
<|im_start|>system
You are a helpful assistant.<|im_end|>
{% endif %}
{% for message in messages %}
    {% if message['role'] == 'tool' %}{% continue %}{% endif %}
<|im_start|>{{ message['role'] }}
{{ message['content'] }}<|im_end|>
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}"""

LLAMA2_TEMPLATE = """{% if messages[0]['role'] == 'system' %}
    {% set system = messages[0]['content'] %}{% set turns = messages[1:] %}
{% else %}
    {% set system = none %}{% set turns = messages %}
{% endif %}
{% for message in turns %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('roles must alternate user/assistant/user/...') }}
    {% endif %}
    {% if message['role'] == 'user' %}
{{ bos_token }}[INST] {% if loop.first and system %}<<SYS>>
{{ system }}
<</SYS>>

{% endif %}{{ message['content'] | trim }} [/INST]
    {%- else %} {{ message['content'] | trim }} {{ eos_token }}
    {%- endif %}
{% endfor %}"""

# Gemma's turn format, written for the tests (the Gemma 3 270M file has no template).
GEMMA_TEMPLATE = """{{ bos_token }}{% set ns = namespace(prefix='') %}
{% if messages[0]['role'] == 'system' %}
    {% set ns.prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}
{% else %}
    {% set turns = messages %}
{% endif %}
{% for message in turns %}
    {% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {% endif %}
    {% set role = 'model' if message['role'] == 'assistant' else message['role'] %}
<start_of_turn>{{ role }}
{{ (ns.prefix if loop.first else '') + message['content'] | trim }}<end_of_turn>
{% if message.get('meta') %}{{ message['meta'] | tojson }}
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<start_of_turn>model
{% endif %}"""

_WORDS = ("the model reads packed weights from the file and streams them once per token "
          "def return import class self yield lambda async await None True False "
          "données café naïve über straße façade niño crème brûlée "
          "привет мир данные модель токен "
          "日本語 中文 数据 模型 東京 学习 "
          "x = 1 + 2 * 3 for i in range ( 10 ) : print ( i ) "
          "{ } [ ] < > = == != # // \\ \" ' ; , . ? ! 42 3.14 2026 0x1F").split()


# Real code for the vocabulary to learn from; these stdlib modules change little
# between Python versions, and a different vocabulary only changes the ids.
_SOURCES = ("textwrap", "string", "json.decoder")


def corpus(seed: int, lines: int = 400) -> list[str]:
    """Lines of mixed prose, code and several scripts, with indents and tabs,
    then the lines of a few standard-library modules."""
    import importlib
    import inspect

    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = rng.choices(_WORDS, k=rng.randint(3, 14))
        indent = rng.choice(["", "", "    ", "\t", "        "])
        out.append(indent + " ".join(words) + rng.choice(["", ".", ":", " \n"]))
    for name in _SOURCES:
        out += inspect.getsource(importlib.import_module(name)).splitlines()
    return out


CHATML_CONTROL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_USER = ("<think>", "</think>")


def gpt2_metadata(seed: int = 0, vocab_size: int = 1200, pre: str = "qwen2",
                  add_bos: bool = False, add_eos: bool = False,
                  control: tuple[str, ...] = CHATML_CONTROL,
                  user: tuple[str, ...] = THINK_USER) -> dict[str, Any]:
    """A byte-level BPE vocabulary: the trained tokens, then ``control``
    (CONTROL; default ``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``) and
    ``user`` (USER_DEFINED; default ``<think>``, ``</think>``), written as
    llama.cpp's converter writes added tokens: their own text, not the byte
    alphabet's. BOS and pad are ``control[0]``, EOS ``<|im_end|>`` where there
    is one, else ``control[1]``."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers
    require_transformers("a GPT-2-style test vocabulary (GGUF_PRE_TOKENIZER_SPLITS)")
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    split = GGUF_PRE_TOKENIZER_SPLITS.get(pre)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    tok.pre_tokenizer = byte_level if split is None else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(seed), trainer)
    tokens = _tokens_by_id(tok)
    merges = [m if isinstance(m, str) else " ".join(m)
              for m in json.loads(tok.to_str())["model"]["merges"]]
    types = [NORMAL] * len(tokens) + [CONTROL] * len(control) + [USER_DEFINED] * len(user)
    tokens += list(control) + list(user)
    eos = "<|im_end|>" if "<|im_end|>" in control else control[1]
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": tokens.index(control[0]),
        "tokenizer.ggml.eos_token_id": tokens.index(eos),
        "tokenizer.ggml.padding_token_id": tokens.index(control[0]),
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_eos_token": add_eos,
        "tokenizer.chat_template": CHATML_TEMPLATE,
    }


def llama_metadata(seed: int = 0, vocab_size: int = 1000, add_bos: bool = True,
                   add_space_prefix: bool = True) -> dict[str, Any]:
    """A sentencepiece-style vocabulary with byte fallback: scores are minus
    the merge rank (llama.cpp merges the best-scoring pair first); characters
    outside the 120 most frequent are left to the byte tokens."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    specials = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    tok.pre_tokenizer = pre_tokenizers.Split(SPACE, behavior="merged_with_next")  # pieces stay in words
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, limit_alphabet=120,
                                  show_progress=False)
    tok.train_from_iterator(corpus(seed), trainer)
    tokens = _tokens_by_id(tok)
    assert tokens[:len(specials)] == specials
    pieces = len(tokens) - len(specials)
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * len(specials) + [-float(r) for r in range(pieces)],
        "tokenizer.ggml.token_type": [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * pieces,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": add_bos,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
        "tokenizer.chat_template": LLAMA2_TEMPLATE,
    }


def sentencepiece_llama_metadata(seed: int = 0, vocab_size: int = 800,
                                 add_space_prefix: bool = True) -> tuple[dict[str, Any], Any]:
    """(metadata, processor): a BPE model trained by sentencepiece with Llama's
    settings (byte fallback, no normalization, whitespace kept), its pieces,
    scores and types written as llama.cpp's converter writes them."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus(seed)), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, byte_fallback=True, character_coverage=0.98,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=add_space_prefix, allow_whitespace_only_pieces=True,
        split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(float(sp.get_score(i)))
        types.append(UNKNOWN if sp.is_unknown(i) else CONTROL if sp.is_control(i)
                     else BYTE if sp.is_byte(i) else NORMAL)
    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }
    return md, sp


def write_tokenizer_gguf(path: str | Path, metadata: dict[str, Any], architecture: str) -> Path:
    """A GGUF holding only these keys and ``general.architecture`` (no tensors):
    enough for transformers' ``AutoTokenizer.from_pretrained(dir, gguf_file=...)``
    and for llama.cpp's vocab_only load (``tests/lcpp.py``), which wants the
    token types as INT32, as llama.cpp's converter writes them."""
    from gguf.constants import GGUFValueType

    from muser_torch.gguf_io import save_gguf

    path = Path(path)
    save_gguf(path, {"general.architecture": architecture, "general.name": "tiny", **metadata}, {},
              types={"tokenizer.ggml.token_type": GGUFValueType.INT32,
                     "tokenizer.ggml.scores": GGUFValueType.FLOAT32})
    return path


def _tokens_by_id(tok: Any) -> list[str]:
    vocab = tok.get_vocab(with_added_tokens=True)
    tokens = sorted(vocab, key=vocab.__getitem__)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    return tokens
