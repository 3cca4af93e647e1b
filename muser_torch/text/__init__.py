"""Text in and out of a model: the tokenizer a GGUF file describes, and its chat template.

``tokenizer_from_metadata(gguf.metadata)`` reads ``tokenizer.ggml.model``:
"glimmer-bytes" gives the demo's ``ByteTokenizer``; "llama" (sentencepiece)
and "gpt2" (byte-level BPE) give a ``GGUFTokenizer``, which needs the ``hf``
extra (transformers, tokenizers, jinja2), imported only then.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import MetadataError
from .gguf_tokenizer import MODELS, GGUFTokenizer   # imports no third-party package itself
from .metadata import MODEL_KEY

from .byte_tokenizer import MODEL_NAME as BYTE_MODEL
from .byte_tokenizer import ByteTokenizer
SUPPORTED_MODELS = (BYTE_MODEL,) + MODELS
NO_VOCAB = ("none", "no_vocab")   # llama.cpp's LLAMA_VOCAB_TYPE_NONE


def tokenizer_from_metadata(metadata: Mapping[str, Any]) -> "ByteTokenizer | GGUFTokenizer | None":
    """The tokenizer a file's metadata describes; None when it has no
    ``tokenizer.ggml.model`` or names none ("none" / "no_vocab", llama.cpp's
    words for a file without a vocabulary). Bad keys raise ``MetadataError``
    naming the key."""
    name = metadata.get(MODEL_KEY)
    if name is None or name in NO_VOCAB:
        return None
    if name == BYTE_MODEL:
        return ByteTokenizer.from_metadata(metadata)
    if name in MODELS:
        return GGUFTokenizer.from_metadata(metadata)
    raise MetadataError(f"{MODEL_KEY} is {name!r}; the tokenizer models supported are "
                        f"{list(SUPPORTED_MODELS)} (or {' / '.join(NO_VOCAB)}: no tokenizer)")


__all__ = ["NO_VOCAB", "SUPPORTED_MODELS", "ByteTokenizer", "GGUFTokenizer", "tokenizer_from_metadata"]
