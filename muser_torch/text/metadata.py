"""The ``tokenizer.ggml.*`` keys of a GGUF file, checked before any tokenizer is built.

This module needs no third-party package: ``ByteTokenizer`` (the demo's byte
tokenizer) uses its id check too. Every refusal is a ``MetadataError`` naming
the key, what was found and what is allowed.

The defaults for keys a file may leave out are llama.cpp's (src/llama-vocab.cpp,
``llama_vocab::impl::load``), since llama.cpp is the program these files are
written for.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..errors import ChatTemplateError, MetadataError

PREFIX = "tokenizer.ggml."
MODEL_KEY = PREFIX + "model"
CHAT_TEMPLATE_KEY = "tokenizer.chat_template"

# llama.cpp's token types (gguf-py's TokenType / llama_token_type).
TOKEN_TYPES = {0: "UNDEFINED", 1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL",
               4: "USER_DEFINED", 5: "UNUSED", 6: "BYTE"}

# Special token ids a file may name, keyed by the role name the chat template
# sees (transformers passes the same four to templates as ``bos_token`` ...).
SPECIAL_ID_KEYS = {
    "bos_token": PREFIX + "bos_token_id",
    "eos_token": PREFIX + "eos_token_id",
    "unk_token": PREFIX + "unknown_token_id",
    "pad_token": PREFIX + "padding_token_id",
}
# Further ids that end a generation (llama.cpp's EOT and EOM).
END_ID_KEYS = (PREFIX + "eot_token_id", PREFIX + "eom_token_id")

# Token texts that llama.cpp treats as end of generation wherever they occur in
# a vocabulary (its "auto-detect special tokens by text" list for EOG ids).
END_OF_TURN_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
    # Muse Glimmer's turn ends: its converter writes eot_token_id for <|eot|>
    # only, but both end a turn in the release's chat template.
    "<|eot|>", "<|eom|>",
})

# ``tokenizer.ggml.pre`` values of BPE files for which llama.cpp adds BOS by
# default (its LLAMA3 pre-tokenizer arm sets add_bos and ignore_merges).
LLAMA3_FAMILY_PRE = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1",
                               "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"})

FLAG_KEYS = ("add_bos_token", "add_eos_token", "add_space_prefix")

# The largest vocabulary (and merge list) read: published vocabularies have at
# most a few hundred thousand tokens (Gemma 3: 262,144); a count past this is
# refused before any per-token work (a set, a dict, the tokenizer build).
MAX_VOCAB = 1 << 24


@dataclass(frozen=True)
class VocabMetadata:
    """The checked tokenizer keys of one file; what the tokenizer is built from."""
    model: str
    architecture: str
    tokens: list[str]
    scores: list[float] | None
    token_types: list[int] | None
    merges: list[str] | None
    pre: str | None
    special_ids: dict[str, int]        # role ("bos_token", ...) -> id, only those the file names
    end_ids: tuple[int, ...]           # EOT / EOM ids the file names
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    chat_template: str | None

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("bos_token")

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("eos_token")

    def stop_ids(self, ids: Mapping[str, int] | None = None) -> tuple[int, ...]:
        """EOS first, then EOT/EOM and the end-of-turn tokens found by text, each once.
        ``ids`` (text -> id of a vocabulary without repeated texts) finds those
        by lookup instead of a pass over the tokens."""
        found = [self.eos_id] if self.eos_id is not None else []
        found += self.end_ids
        if ids is None:
            found += [i for i, t in enumerate(self.tokens) if t in END_OF_TURN_TEXTS]
        else:
            found += sorted(ids[t] for t in END_OF_TURN_TEXTS if t in ids)
        return tuple(dict.fromkeys(found))


def token_id(md: Mapping[str, Any], key: str, vocab_size: int) -> int | None:
    """The token id stored under ``key``, or None when the key is absent.

    Only integers in ``[0, vocab_size)`` pass: llama.cpp reads these keys as
    u32 and refuses other value types, so a float (even an integral one), a
    bool or a string is refused here as well."""
    if key not in md:
        return None
    v = md[key]
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        if 0 <= int(v) < vocab_size:
            return int(v)
        raise MetadataError(f"{key} is {int(v)}, outside the vocabulary [0, {vocab_size})")
    raise MetadataError(f"{key} is {_show(v)}, expected an integer token id in [0, {vocab_size})")


def read_vocab_metadata(md: Mapping[str, Any], model: str) -> VocabMetadata:
    """Check every key the ``model`` ("llama" or "gpt2") tokenizer reads."""
    tokens = _string_list(md, PREFIX + "tokens", required=True, max_items=MAX_VOCAB)
    if not tokens:
        raise MetadataError(f"{PREFIX}tokens is empty, expected the vocabulary")
    n = len(tokens)
    scores = _number_list(md, PREFIX + "scores", n, required=model == "llama")
    token_types = _token_types(md, n)
    merges = _merges(md, tokens, required=model == "gpt2")
    pre = _optional_str(md, PREFIX + "pre")
    architecture = _optional_str(md, "general.architecture") or ""

    special_ids = {}
    for role, key in SPECIAL_ID_KEYS.items():
        i = token_id(md, key, n)
        if i is not None:
            special_ids[role] = i
    end_ids = tuple(i for i in (token_id(md, k, n) for k in END_ID_KEYS) if i is not None)

    flags = {name: _optional_bool(md, PREFIX + name) for name in FLAG_KEYS}
    if flags["add_bos_token"] is None:
        # llama.cpp: sentencepiece vocabularies add BOS, BPE ones only in the llama3 family.
        flags["add_bos_token"] = model == "llama" or pre in LLAMA3_FAMILY_PRE
    if flags["add_space_prefix"] is None:
        flags["add_space_prefix"] = model == "llama"   # llama.cpp: on for SPM, off for BPE
    for flag, role in (("add_bos_token", "bos_token"), ("add_eos_token", "eos_token")):
        if flags[flag] and role not in special_ids:
            raise MetadataError(f"{PREFIX}{flag} is set (or defaults to on for a {model!r} "
                                f"tokenizer) but {SPECIAL_ID_KEYS[role]} is missing")

    template = md.get(CHAT_TEMPLATE_KEY)
    if template is not None and not isinstance(template, str):
        raise ChatTemplateError(f"{CHAT_TEMPLATE_KEY} is {_show(template)}, expected a string")

    return VocabMetadata(model=model, architecture=architecture, tokens=tokens, scores=scores,
                         token_types=token_types, merges=merges, pre=pre,
                         special_ids=special_ids, end_ids=end_ids,
                         add_bos=flags["add_bos_token"], add_eos=bool(flags["add_eos_token"]),
                         add_space_prefix=flags["add_space_prefix"], chat_template=template)


# ---- value checks -------------------------------------------------------------

def _show(v: Any) -> str:
    text = repr(v)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{text} ({type(v).__name__})"


def _as_list(md: Mapping[str, Any], key: str, max_items: int = MAX_VOCAB) -> list | None:
    v = md.get(key)
    if v is None:
        return None
    if hasattr(v, "tolist") and not isinstance(v, (str, bytes)):
        if getattr(v, "size", 0) > max_items:
            _too_many(key, v.size, max_items)
        v = v.tolist()      # a numpy array from a caller's own dict
    if not isinstance(v, (list, tuple)):
        raise MetadataError(f"{key} is {_show(v)}, expected an array")
    if len(v) > max_items:
        _too_many(key, len(v), max_items)
    return list(v)


def _too_many(key: str, n: int, most: int) -> None:
    raise MetadataError(f"{key} has {n:,} entries; at most {most:,} are read (the largest "
                        f"published vocabularies have a few hundred thousand tokens)")


def _string_list(md: Mapping[str, Any], key: str, required: bool,
                 max_items: int = MAX_VOCAB) -> list[str] | None:
    items = _as_list(md, key, max_items)
    if items is None:
        if required:
            raise MetadataError(f"{key} is missing")
        return None
    if set(map(type, items)) == {str}:
        return items    # what our reader gives; the loop below finds the bad entry otherwise
    for i, t in enumerate(items):
        if not isinstance(t, str):
            raise MetadataError(f"{key}[{i}] is {_show(t)}, expected a string")
    return items


def _number_list(md: Mapping[str, Any], key: str, n: int, required: bool) -> list[float] | None:
    items = _as_list(md, key)
    if items is None:
        if required:
            raise MetadataError(f"{key} is missing (a sentencepiece vocabulary needs its scores)")
        return None
    if len(items) != n:
        raise MetadataError(f"{key} has {len(items)} entries, expected one per token ({n})")
    # what our reader gives (a finite sum has no inf or nan in it; one that
    # overflows goes the long way); the loop below finds the bad entry otherwise
    if set(map(type, items)) == {float} and math.isfinite(sum(items)):
        return items
    for i, s in enumerate(items):
        if isinstance(s, bool) or not isinstance(s, numbers.Real) or not math.isfinite(s):
            raise MetadataError(f"{key}[{i}] is {_show(s)}, expected a finite number")
    return [float(s) for s in items]


def _token_types(md: Mapping[str, Any], n: int) -> list[int] | None:
    key = PREFIX + "token_type"
    items = _as_list(md, key)
    if items is None:
        return None
    if len(items) != n:
        raise MetadataError(f"{key} has {len(items)} entries, expected one per token ({n})")
    if set(map(type, items)) == {int} and set(items) <= TOKEN_TYPES.keys():
        return items
    for i, t in enumerate(items):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or int(t) not in TOKEN_TYPES:
            raise MetadataError(f"{key}[{i}] is {_show(t)}, expected one of "
                                f"{sorted(TOKEN_TYPES)} ({', '.join(TOKEN_TYPES.values())})")
    return [int(t) for t in items]


def _merges(md: Mapping[str, Any], tokens: Sequence[str], required: bool) -> list[str] | None:
    key = PREFIX + "merges"
    items = _string_list(md, key, required=False)
    if items is None:
        if required:
            raise MetadataError(f"{key} is missing (a BPE vocabulary needs its merges)")
        return None
    vocab = set(tokens)
    for i, m in enumerate(items):
        parts = m.split(" ")
        if len(parts) != 2 or not all(parts):
            raise MetadataError(f"{key}[{i}] is {m!r}, expected two tokens separated by one space")
        for part in parts:
            if part not in vocab:
                raise MetadataError(f"{key}[{i}] is {m!r}: {part!r} is not in {PREFIX}tokens")
    return items


def _optional_str(md: Mapping[str, Any], key: str) -> str | None:
    v = md.get(key)
    if v is not None and not isinstance(v, str):
        raise MetadataError(f"{key} is {_show(v)}, expected a string")
    return v


def _optional_bool(md: Mapping[str, Any], key: str) -> bool | None:
    v = md.get(key)
    if v is not None and not isinstance(v, bool):
        raise MetadataError(f"{key} is {_show(v)}, expected a bool")
    return v
