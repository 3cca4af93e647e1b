"""llama.cpp's SentencePiece-style BPE vocabularies: ``tokenizer.ggml.model =
"gpt2"`` with a ``tokenizer.ggml.pre`` of its GEMMA4 family (``SPM_BPE_PRE``;
"granite-embed-multi-311m" is the name llama.cpp's converter gives Gemma 3's
``tokenizer.json``, whose probe hash it shares).

Unlike a byte-level BPE, the vocabulary holds literal UTF-8, U+2581 for a
space and ``<0xNN>`` byte tokens. llama.cpp (``LLAMA_VOCAB_PRE_TYPE_GEMMA4``)
matches the CONTROL and USER_DEFINED tokens in the text first, replaces every
space by U+2581, splits runs of newlines from the rest (``[^\\n]+|[\\n]+``),
merges by rank over characters (no GPT-2 byte alphabet) and falls back to
byte tokens. ``backend`` builds that pipeline from ``tokenizers``' own parts;
transformers' GGUF conversion has no such pre-tokenizer."""
from __future__ import annotations

from typing import Any

from .metadata import VocabMetadata

SPM_BPE_PRE = frozenset({"gemma4", "granite-embed-multi-311m"})
SPACE = "\u2581"
CONTROL, USER_DEFINED = 3, 4   # llama.cpp's token types matched before merging


def backend(vocab: VocabMetadata) -> Any:
    """The ``tokenizers.Tokenizer`` of a checked SentencePiece-style BPE vocabulary."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    ids = {t: i for i, t in enumerate(vocab.tokens)}
    # metadata.read_vocab_metadata checked each merge: two tokens of the vocabulary
    merges = [tuple(m.split(" ")) for m in vocab.merges or ()]
    unk_id = vocab.special_ids.get("unk_token")
    model = models.BPE(vocab=ids, merges=merges, byte_fallback=True, fuse_unk=True,
                       unk_token=None if unk_id is None else vocab.tokens[unk_id])
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Replace(" ", SPACE)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("\n+"), behavior="isolated")
    tok.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    types = vocab.token_types or [1] * len(vocab.tokens)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, k in zip(vocab.tokens, types) if k == CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, k in zip(vocab.tokens, types) if k == USER_DEFINED])
    return tok
