"""Structured output: a request's JSON schema (``response_format``) as a mask
over the next token, through llguidance (the ``serve`` extra).

llguidance needs every token's bytes. They come from the GGUF's own token
list (``tokenizer.ggml.tokens`` and ``token_type``), not from a Hugging Face
tokenizer: a BYTE token ``<0xNN>`` is that byte; a CONTROL token, or a
USER_DEFINED one spelled ``<...>``, is its text after a 0xFF byte (llguidance's
mark of a special token, which no grammar matches as text); a GPT-2-style
vocabulary spells bytes through GPT-2's byte-to-character table; a
SentencePiece one writes a space as U+2581.

The same machinery makes a tool call's grammar (``tools.tool_grammar``, Lark
with ``%json`` call objects) into a ``Constraint`` (``lark_constraint``).

A ``Constraint`` is one request's matcher: ``mask`` sets the logits of the
tokens the schema forbids next to -inf, ``take`` advances past the sampled
token. Once the schema is complete only the stop tokens remain allowed, so a
response ends with one ("stop").
"""
from __future__ import annotations

import functools
from typing import Any, Sequence

import numpy as np
import torch

from ..text.metadata import TOKEN_TYPES
from .schemas import RequestError

__all__ = ["Grammars", "Constraint", "token_bytes"]

SPECIAL_MARK = b"\xff"      # llguidance: a special token's bytes start with 0xFF
SPM_SPACE = "\u2581"
_TYPE = {name: i for i, name in TOKEN_TYPES.items()}
# JSON as json.dumps writes it: no free white space between tokens (a sampled
# response cannot wander in blanks until max_tokens); a schema's own
# "x-guidance" options override this
COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_BYTE = _TYPE["CONTROL"], _TYPE["USER_DEFINED"], _TYPE["BYTE"]


@functools.lru_cache(maxsize=1)
def _gpt2_byte_of() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand
    for themselves, the others for 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(model: str, tokens: Sequence[str], types: Sequence[int] | None) -> list[bytes]:
    """The bytes each token id stands for (see the module docstring)."""
    byte_of = _gpt2_byte_of() if model == "gpt2" else None
    out = []
    for i, text in enumerate(tokens):
        kind = types[i] if types is not None else 1
        if kind == TYPE_BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            out.append(bytes([int(text[3:5], 16)]))
        elif kind == TYPE_CONTROL or (kind == TYPE_USER_DEFINED and text.startswith("<")
                                      and text.endswith(">")):
            out.append(SPECIAL_MARK + text.encode("utf-8"))
        elif byte_of is not None and all(c in byte_of for c in text):
            out.append(bytes(byte_of[c] for c in text))
        else:
            out.append(text.replace(SPM_SPACE, " ").encode("utf-8"))
    return out


def vocabulary(tokenizer: Any) -> tuple[str, list[str], list[int] | None]:
    """(model, tokens, token types) of a model's tokenizer, as its file has them."""
    vocab = getattr(tokenizer, "vocab", None)
    if vocab is not None:                       # GGUFTokenizer
        return vocab.model, list(vocab.tokens), vocab.token_types
    md = tokenizer.to_metadata()                # the demo's ByteTokenizer
    return (md["tokenizer.ggml.model"], md["tokenizer.ggml.tokens"],
            md.get("tokenizer.ggml.token_type"))


class _Encoder:
    """What llguidance's ``TokenizerWrapper`` reads: the token bytes, EOS and
    BOS ids, and a call that tokenizes text (no BOS)."""

    def __init__(self, tokenizer: Any, tokens: list[bytes], stop_ids: Sequence[int]):
        self.tokenizer = tokenizer
        self.tokens = tokens
        self.eos_token_id = stop_ids[0]
        self.bos_token_id = getattr(tokenizer, "bos_id", None)
        self.special_token_ids = [i for i, t in enumerate(tokens) if t.startswith(SPECIAL_MARK)]

    def __call__(self, text: str | bytes) -> list[int]:
        if isinstance(text, bytes):
            text = text.decode("utf-8", errors="replace")
        return list(self.tokenizer.encode(text, bos=False))


class Grammars:
    """Compiles requests' schemas against one model's vocabulary (built on
    first use: about a second for a large vocabulary)."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.stop_ids = list(tokenizer.stop_ids)
        self._lltok = None
        self._specials: frozenset[str] = frozenset()    # texts of the special-marked tokens

    def _ll_tokenizer(self):
        if self._lltok is None:
            llguidance = _require()
            model, tokens, types = vocabulary(self.tokenizer)
            raw = token_bytes(model, tokens, types)
            raw += [b""] * (self.vocab_size - len(raw))     # rows past the vocabulary: never allowed
            self._specials = frozenset(t[len(SPECIAL_MARK):].decode("utf-8", errors="replace")
                                       for t in raw if t.startswith(SPECIAL_MARK))
            wrapper = llguidance.TokenizerWrapper(_Encoder(self.tokenizer, raw, self.stop_ids))
            self._lltok = llguidance.LLTokenizer(wrapper, n_vocab=self.vocab_size,
                                                 eos_token=self.stop_ids)
        return self._lltok

    def constraint(self, schema_json: str) -> "Constraint":
        """A fresh matcher for the schema; a schema llguidance cannot compile
        is a 400 naming its reason."""
        llguidance = _require()
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema_json, defaults=COMPACT)
        except ValueError as e:
            raise RequestError(f"response_format: {' '.join(str(e).split())[:300]}",
                               param="response_format") from None
        return self._matcher(grammar, "response_format", "the schema cannot be followed")

    def lark_constraint(self, lark: str, param: str) -> "Constraint":
        """A fresh matcher for a Lark grammar (``tools.tool_grammar``'s); one
        llguidance cannot compile (a function's ``parameters`` it cannot
        follow) is a 400 naming ``param``."""
        grammar = _require().LLMatcher.grammar_from_lark(lark)
        return self._matcher(grammar, param, "the tools' parameters cannot be followed")

    def is_special(self, text: str) -> bool:
        """Whether the vocabulary holds ``text`` as one special-marked token
        (a grammar then names it as a token: it is never matched as text)."""
        self._ll_tokenizer()
        return text in self._specials

    def _matcher(self, grammar: str, param: str, what: str) -> "Constraint":
        llguidance = _require()
        try:
            matcher = llguidance.LLMatcher(self._ll_tokenizer(), grammar, log_level=0)
        except ValueError as e:     # a grammar the constructor refuses outright
            raise RequestError(f"{param}: {what}: {' '.join(str(e).split())[:300]}",
                               param=param) from None
        if matcher.is_error():
            reason = " ".join(matcher.get_error().split())[:300]
            raise RequestError(f"{param}: {what}: {reason}", param=param)
        return Constraint(matcher, self.vocab_size)


class Constraint:
    """One response's position in its grammar."""

    def __init__(self, matcher: Any, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size

    def allowed(self) -> torch.Tensor:
        """``[vocab]`` bool: the tokens the grammar allows next."""
        # bit i of the mask's little-endian bytes is token i
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8),
                             count=self.vocab_size, bitorder="little")
        return torch.from_numpy(bits.view(np.bool_))

    def mask(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits [1, V]`` with the forbidden tokens at -inf (a new tensor)."""
        keep = self.allowed().to(logits.device, non_blocking=True)
        return torch.where(keep, logits, float("-inf"))

    def take(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused token {token}: "
                               f"{self.matcher.get_error() or 'no reason given'}")

    def copy(self) -> "Constraint":
        """A copy at the same position, to take tokens on trial (a draft's
        candidates). A copy, not the matcher's rollback: with llguidance 1.9
        a mask computed after a rollback could allow what the grammar forbids
        (a space where ``: `` was forced), and a copy costs a few microseconds."""
        return Constraint(self.matcher.deep_copy(), self.vocab_size)


def _require():
    from ..text import requirements
    return requirements.require("llguidance")
