"""llama.cpp's SentencePiece tokenizer (``tokenizer.ggml.model = "llama"``,
LLAMA_VOCAB_TYPE_SPM: Llama 2, Mistral, Gemma 3), built straight from the
file's ``tokens``, ``scores`` and ``token_type`` arrays.

The rules, as llama.cpp's ``llama_tokenize`` applies them (src/llama-vocab.cpp;
read for the facts, not the code):

1. Special tokens are cut out of the text first (``tokenizer_st_partition``):
   USER_DEFINED always, CONTROL and UNKNOWN only with ``parse_special``. The
   longest (in UTF-8 bytes) goes first, each of its occurrences left to right,
   then the next one in the text left between. Gemma 3's runs of 2 to 31
   spaces, of tabs and of newlines are USER_DEFINED tokens, so a long run is
   taken longest token first.
2. Each run of text left is one fragment: a space in front when the file's
   ``add_space_prefix`` is on and the fragment starts the text or follows a
   special token, every " " written as U+2581.
3. A fragment starts as its characters. Every adjacent pair whose text is a
   token (any token of the vocabulary) is a candidate; the one with the
   highest score merges first, the leftmost among equal scores, and the
   merged symbol offers new pairs with its neighbours. Merging stops when no
   pair is a token.
4. A symbol that is a token gives its id; one that is not (a character the
   vocabulary lacks) gives the byte tokens ``<0xNN>`` of its UTF-8 bytes.
   (llama.cpp also looks a non-token symbol up among the merges it made, but
   every merged symbol is a token, so only single characters reach the bytes.)

Token types follow llama.cpp's loader (``special.llama_cpp_types``). An empty token is
spelled ``[EMPTY_<id>]``, and a text held by two ids means the later one, as
llama.cpp's text-to-id map has it.

Nothing here parses JSON or needs a third-party package: building the
262,144-token Gemma 3 vocabulary is one dict and two lists.
"""
from __future__ import annotations

import heapq
import re
from typing import Iterable, Sequence

from ..errors import MetadataError
from .special import llama_cpp_types

SPACE = "\u2581"
_NOT_NORMAL = re.compile(rb"[^\x01]")
# llama.cpp's token types (gguf-py's TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

class SpmTokenizer:
    """One vocabulary's encoder and decoder (module docstring). ``encode``
    gives the ids of a text without BOS or EOS; ``decode`` the text of ids,
    CONTROL and UNKNOWN tokens left out."""

    def __init__(self, tokens: Sequence[str], scores: Sequence[float] | None,
                 types: Sequence[int] | None, add_space_prefix: bool) -> None:
        n = len(tokens)
        # Building is one dict and one pass over the types: every other table
        # reads only the few thousand tokens that are not NORMAL.
        texts = tokens   # read, never changed
        self.ids: dict[str, int] = dict(zip(texts, range(n)))   # a repeated text: the last id
        if "" in self.ids:   # rare: the dict answers at once where a scan of the list would not
            texts = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
            self.ids = dict(zip(texts, range(n)))
        self.texts: Sequence[str] = texts
        self.scores: Sequence[float] = scores if scores is not None else [0.0] * n
        self.types: list[int] = llama_cpp_types(texts, types, self.ids)
        self.add_space_prefix = add_space_prefix
        self.byte_ids = [self.ids.get(f"<0x{b:02X}>", self.ids.get(chr(b))) for b in range(256)]
        # the ids of the types that are not NORMAL: a regex over the types as
        # bytes (0-6, checked by metadata.py) finds them in C, not a Python loop
        odd = [m.start() for m in _NOT_NORMAL.finditer(bytes(self.types))]
        check_byte_tokens(texts, [i for i in odd if self.types[i] == BYTE])
        # (text, id) of the special tokens, in the order they are cut out: the
        # longest in UTF-8 bytes first; among equal lengths by id (llama.cpp's
        # std::sort leaves their order open; it matters only where two of one
        # length overlap in a text, which Gemma 3's vocabulary has nowhere).
        specials = [(texts[i], i) for i in odd if self.types[i] in (CONTROL, UNKNOWN, USER_DEFINED)]
        specials.sort(key=lambda p: (-len(p[0].encode("utf-8")), p[1]))
        self._all_specials = specials
        self._user_specials = [p for p in specials if self.types[p[1]] == USER_DEFINED]
        # CONTROL in the file, USER_DEFINED in llama.cpp (gpt-oss's markers):
        # matched always, except in a chat message's text (``markup_as_text``)
        self.demoted = {t: i for t, i in self._user_specials if types and types[i] == CONTROL}
        self._text_specials = [p for p in self._user_specials if p[0] not in self.demoted]
        self._skip = frozenset(i for i in odd if self.types[i] in (CONTROL, UNKNOWN))
        self._bytes_of = {i: int(texts[i][3:5], 16) for i in odd if self.types[i] == BYTE}
        # text -> id of the tokens parse_special turns on, the first id of a text
        self.controls: dict[str, int] = {}
        for i in sorted(self._skip):
            self.controls.setdefault(texts[i], i)

    # ---- encoding -----------------------------------------------------------

    def encode(self, text: str, parse_special: bool = False,
               markup_as_text: bool = False) -> list[int]:
        """The ids of ``text``, BOS and EOS left to the caller (llama.cpp's
        ``llama_tokenize`` with add_special false). ``markup_as_text`` keeps
        the ``demoted`` tokens' text as text too (a chat message's text)."""
        out: list[int] = []
        prev_special = True   # the first fragment is prefixed, as after a special token
        for part in self.partition(text, parse_special, markup_as_text):
            if isinstance(part, int):
                out.append(part)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:
                part = " " + part
            out += self._merge(part.replace(" ", SPACE))
            prev_special = False
        return out

    def partition(self, text: str, parse_special: bool,
                  markup_as_text: bool = False) -> list[str | int]:
        """``text`` as runs of text and special-token ids (rule 1)."""
        specials = self._all_specials if parse_special else \
            self._text_specials if markup_as_text else self._user_specials
        parts: list[str | int] = [text] if text else []
        for tok, i in specials:
            if tok not in text:   # the whole text first: most tokens appear nowhere
                continue
            cut: list[str | int] = []
            for p in parts:
                if isinstance(p, int) or tok not in p:
                    cut.append(p)
                    continue
                for k, piece in enumerate(p.split(tok)):
                    if k:
                        cut.append(i)
                    if piece:
                        cut.append(piece)
            parts = cut
        return parts

    def _merge(self, text: str) -> list[int]:
        """Rules 3 and 4 on one fragment. Symbols are runs of ``text``: symbol
        ``i`` starts at character ``i`` and is ``length[i]`` long (0 once merged
        into its left neighbour); ``prev``/``next`` link the live ones."""
        n = len(text)
        if n == 0:
            return []
        ids_get, scores = self.ids.get, self.scores
        length = [1] * n
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        # (-score, left, right, size): the highest score first, then the leftmost.
        # An entry is stale once either side has changed: sizes only grow, so
        # a stale entry's size never matches again.
        heap = []
        for i in range(n - 1):
            t = ids_get(text[i:i + 2])
            if t is not None:
                heap.append((-scores[t], i, i + 1, 2))
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        while heap:
            _, left, right, size = pop(heap)
            ln, rn = length[left], length[right]
            if ln == 0 or rn == 0 or ln + rn != size:
                continue
            length[left], length[right] = size, 0
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
                t = ids_get(text[left:after + length[after]])
                if t is not None:
                    push(heap, (-scores[t], left, after, size + length[after]))
            before = prev[left]
            if before >= 0:
                t = ids_get(text[before:left + size])
                if t is not None:
                    push(heap, (-scores[t], before, left, length[before] + size))
        out: list[int] = []
        i = 0
        while i != -1:
            piece = text[i:i + length[i]]
            t = ids_get(piece)
            if t is not None:
                out.append(t)
            else:
                out += self._bytes(piece)
            i = nxt[i]
        return out

    def _bytes(self, piece: str) -> list[int]:
        try:
            data = piece.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"the text holds {piece!r}, a lone surrogate, which has no "
                             f"UTF-8 bytes to tokenize") from None
        out = []
        for b in data:
            t = self.byte_ids[b]
            if t is None:
                raise ValueError(f"{piece!r} is not in the vocabulary, which has no byte "
                                 f"token <0x{b:02X}> to spell it")
            out.append(t)
        return out

    # ---- decoding -----------------------------------------------------------

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``: U+2581 as a space, byte tokens joined into their
        UTF-8 (a run that is not valid UTF-8 gives U+FFFD per byte, as the
        ``tokenizers`` byte fallback this replaces did), CONTROL and UNKNOWN
        tokens left out, and with the space prefix on, the first space off."""
        pieces: list[str] = []
        run = bytearray()
        for i in ids:
            if i in self._skip:
                continue
            byte = self._bytes_of.get(i)
            if byte is not None:
                run.append(byte)
                continue
            if run:
                pieces.append(_utf8_run(run))
                run.clear()
            pieces.append(self.texts[i].replace(SPACE, " "))
        if run:
            pieces.append(_utf8_run(run))
        text = "".join(pieces)
        if self.add_space_prefix and text.startswith(" "):
            text = text[1:]
        return text


def _utf8_run(run: bytearray) -> str:
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * len(run)


def check_byte_tokens(tokens: Sequence[str], byte_ids: Iterable[int]) -> None:
    """Refuse a BYTE token (its id among ``byte_ids``) whose text is not
    ``<0xNN>``: decoding reads its byte from that text."""
    for i in byte_ids:
        t = tokens[i]
        if not (len(t) == 6 and t.startswith("<0x") and t.endswith(">")
                              and all(c in "0123456789ABCDEFabcdef" for c in t[3:5])):
            raise MetadataError(f"tokenizer.ggml.tokens: token {i} is a BYTE token "
                                f"(token_type 6) spelled {t!r}, not <0xNN>")
