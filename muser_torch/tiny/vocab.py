"""A small sentencepiece ("llama") vocabulary for a synthetic text file that
llama.cpp's multimodal tools must read beside a random projector
(``make-tiny --mmproj``; ``llama-mtmd-cli``).

llama.cpp cannot tokenize the demo's byte vocabulary ("glimmer-bytes" is ours
alone) nor a file without one, and ``llama-mtmd-cli`` tokenizes its prompt and
the image's ``<|image_start|>`` / ``<|image_end|>`` through the text file's
vocabulary and renders the prompt with its chat template. So this
vocabulary is the smallest one both programs read: ``<unk>``, ``<s>``,
``</s>``, the 256 byte pieces ``<0xNN>`` (every text falls back to bytes: no
word pieces), sentencepiece's space ``\u2581`` (so a space decodes as one), and as CONTROL tokens the processor's image and
video markers (transformers' ``MuseGlimmerProcessor``, which muser's prompt
blocks use) and ChatML's turn markers, which the chat template below writes.
Scores are all zero: with no pieces longer than a byte there is nothing to rank."""
from __future__ import annotations

from typing import Any

from ..gguf_io import GGUFValueType

__all__ = ["MARKERS", "CHAT_TEMPLATE", "marker_vocab", "vocab_size"]

# the processor's markers, then ChatML's turns
MARKERS = ("<|patch|>", "<|image_start|>", "<|image_end|>", "<|video|>", "<|vid_frame_separator|>",
           "<|vid_start|>", "<|vid_end|>", "<|im_start|>", "<|im_end|>")

# ChatML: a template llama.cpp recognises by its markers without running it,
# and that its Jinja engine and ours render alike.
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")

_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6   # llama.cpp's token types
SPACE = "\u2581"


def _tokens() -> list[str]:
    return ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + [SPACE] + list(MARKERS)


def vocab_size() -> int:
    """The vocabulary's size: the text model's ``vocab_size`` to write with it."""
    return len(_tokens())


def marker_vocab() -> tuple[dict[str, Any], dict[str, GGUFValueType]]:
    """The ``tokenizer.*`` keys, and the GGUF value types of those whose type
    the writer would infer otherwise (``write_tiny``'s ``tokenizer`` and
    ``tokenizer_types``): the token types INT32, as llama.cpp's converter writes them."""
    tokens = _tokens()
    types = [_UNKNOWN, _CONTROL, _CONTROL] + [_BYTE] * 256 + [_NORMAL] + [_CONTROL] * len(MARKERS)
    md = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": [0.0] * len(tokens),
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),   # a turn's end ends generation
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_eos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }
    return md, {"tokenizer.ggml.token_type": GGUFValueType.INT32}
