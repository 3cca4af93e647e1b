"""Tokenizers of llama.cpp files: the sentencepiece "llama" and the BPE "gpt2" models.

A "llama" vocabulary (Llama 2, Mistral, Gemma 3) is tokenized by ``spm.py``,
llama.cpp's own algorithm over the file's tokens, scores and token types:
built in a fraction of a second, with no JSON and no third-party package, and
token for token llama.cpp's, where the ``tokenizers`` BPE that transformers
derives from the scores splits runs of whitespace its own way.

A "gpt2" vocabulary goes, as our reader returns it, into transformers' own GGUF conversion
(``transformers.integrations.gguf.gguf_tokenizer_mapping.convert_gguf_tokenizer``,
what ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` runs), which hands
back a Hugging Face ``tokenizers.Tokenizer``, built once and cached
(``tokenizer_cache.py``). Settings are then made the way llama.cpp reads the
file, where transformers' conversion leaves them out: BPE files of the llama3
family use whole words found in the vocabulary before any merge (llama.cpp's
``ignore_merges``); the added tokens keep the file's spelling
(``_added_tokens_as_written``). ``build_backend`` still converts a "llama"
vocabulary too, with the space prefix set as llama.cpp's (``_set_space_prefix``),
for the tests that hold the old path beside the new.

BOS and EOS are added here, not by the backend, so ``encode(bos=..., eos=...)``
decides; their defaults are the file's ``add_bos_token`` / ``add_eos_token``.

Control-token text in ``encode``'s input is text, as llama.cpp's parse_special
false has it; ``special.py`` holds the rule, and how a chat prompt keeps the
template's markup as control tokens and the messages' text as text.
"""
from __future__ import annotations

import contextlib
import gc
from typing import Any, Iterable, Iterator, Mapping, Sequence

from ..errors import ChatTemplateError, MetadataError
from .chat_limits import ChatLimits
from .metadata import (CHAT_TEMPLATE_KEY, LLAMA3_FAMILY_PRE, MODEL_KEY, PREFIX, VocabMetadata,
                       read_vocab_metadata)
from . import special, spm_bpe, tokenizer_cache
from .spm import SpmTokenizer
from .requirements import require

MODELS = ("gpt2", "llama")
SPACE = "\u2581"   # sentencepiece's visible space


class GGUFTokenizer:
    """A file's tokenizer. Build it with ``from_metadata``; ``backend`` does the
    work: an ``SpmTokenizer`` for "llama", a ``tokenizers.Tokenizer`` for "gpt2"."""

    def __init__(self, vocab: VocabMetadata, backend: Any) -> None:
        self.vocab = vocab
        self.backend = backend
        self._spm = isinstance(backend, SpmTokenizer)
        self.model = vocab.model
        self.bos_id: int | None = vocab.bos_id
        self.eos_id: int | None = vocab.eos_id
        self.stop_ids: tuple[int, ...] = vocab.stop_ids(backend.ids if self._spm else None)
        self.add_bos = vocab.add_bos
        self.add_eos = vocab.add_eos
        self.chat_template: str | None = vocab.chat_template
        # What a chat template sees as bos_token, eos_token, unk_token, pad_token.
        self.special_tokens = {role: vocab.tokens[i] for role, i in vocab.special_ids.items()}
        self._compiled = None
        # Control-token text is text unless asked for (``encode``'s parse_special,
        # the markup of a chat): the backend never matches it, ``special`` does.
        # ``controls`` are the tokens llama.cpp's parse_special decides (its
        # loader's types); ``markup`` adds those the file calls CONTROL and
        # llama.cpp matches always (gpt-oss's channel markers, Muse Glimmer's
        # turns): ``encode`` matches them as llama.cpp does, a chat only in
        # the template's markup.
        if self._spm:
            self.controls = backend.controls
            self._always: dict[str, int] = backend.demoted
        else:
            self.backend.encode_special_tokens = True
            ids = dict(zip(vocab.tokens, range(len(vocab.tokens))))
            types = special.llama_cpp_types(vocab.tokens, vocab.token_types, ids)
            self.controls = special.control_table(vocab.tokens, types)
            file_controls = special.control_table(vocab.tokens, vocab.token_types)
            self._always = {t: i for t, i in file_controls.items()
                            if types[i] == special.USER_DEFINED}
            _controls_as_special(self.backend, self.controls, vocab.token_types)
        self.markup = {**self.controls, **self._always}
        self._marker: "special.Marker | None" = None

    @classmethod
    def from_metadata(cls, md: Mapping[str, Any]) -> "GGUFTokenizer":
        model = md.get(MODEL_KEY)
        if model not in MODELS:
            raise MetadataError(f"{MODEL_KEY} is {model!r}; this class builds {list(MODELS)}")
        if model == "llama":
            with _collector_paused():
                vocab = read_vocab_metadata(md, model)
                return cls(vocab, spm_backend(vocab))
        vocab = read_vocab_metadata(md, model)
        require("tokenizers")   # a cached tokenizer needs no transformers; a build does
        return cls(vocab, tokenizer_cache.load_or_build(md, vocab, build_backend))

    @property
    def vocab_size(self) -> int:
        return len(self.vocab.tokens)

    def token(self, token_id: int) -> str:
        """The vocabulary entry of ``token_id`` as the file spells it."""
        return self.vocab.tokens[self._check_id(token_id)]

    def encode(self, text: str, bos: bool | None = None, eos: bool | None = None,
               parse_special: bool = False) -> list[int]:
        """Token ids of ``text``. As llama.cpp's ``llama_tokenize``: the text of a
        control token (``<end_of_turn>``, ``<|im_end|>``) is text unless
        ``parse_special``, which makes it the token; a USER_DEFINED token
        (``<think>``) is matched whole either way (``special.py``). A chat
        prompt comes from ``encode_chat``, which does both at once.
        ``bos``/``eos`` default to the file's add_bos/add_eos."""
        if not isinstance(text, str):
            raise ValueError(f"encode takes a str, got {type(text).__name__}")
        if not isinstance(bos, (bool, type(None))) or not isinstance(eos, (bool, type(None))):
            raise ValueError(f"bos and eos are True, False or None, got {bos!r} and {eos!r}")
        if not isinstance(parse_special, bool):
            raise ValueError(f"parse_special is True or False, got {parse_special!r}")
        if self._spm:   # llama.cpp's own partition, every special token longest first
            return self._with_ends(self.backend.encode(text, parse_special), bos, eos)
        parts = special.split_controls(text, self.markup if parse_special else self._always)
        return self._with_ends(self._encode_parts(parts), bos, eos)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of ``ids``, special tokens (BOS, EOS, turn markers) left out.
        Decoding a whole sequence gives back the text exactly; a sentencepiece
        decoder drops the leading space of what it decodes, so decode the full
        sequence and take the new suffix when streaming, not token by token."""
        checked = [self._check_id(i) for i in ids]
        if self._spm:
            return self.backend.decode(checked)
        return self.backend.decode(checked, skip_special_tokens=True)

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True,
                            limits: "ChatLimits | None" = None,
                            tools: Sequence[Mapping[str, Any]] | None = None) -> str:
        """The prompt the file's ``tokenizer.chat_template`` makes of ``messages``
        (dicts with "role" and "content"), rendered within ``limits`` (default
        ``ChatLimits()``: 2 s of CPU, 1 MB), with ``tools`` (OpenAI's function
        specs) as the template's ``tools``, as text to read. Its ids come from
        ``encode_chat``, which tells the template's markup from the messages' text;
        ``encode(prompt, bos=False, parse_special=True)`` gives the same ids only
        while no message spells a control token."""
        if self._compiled is None:
            if self.chat_template is None:
                raise ChatTemplateError(f"this file has no {CHAT_TEMPLATE_KEY}, so it cannot chat")
            from .chat import ChatTemplate
            self._compiled = ChatTemplate(self.chat_template, self.special_tokens, limits)
        return self._compiled.render(messages, add_generation_prompt=add_generation_prompt,
                                     limits=limits, tools=None if tools is None else list(tools))

    def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True,
                    limits: "ChatLimits | None" = None,
                    tools: Sequence[Mapping[str, Any]] | None = None,
                    slot: str | None = None) -> list[int]:
        """The ids of the chat prompt ``apply_chat_template`` renders: the markup the
        template writes becomes control tokens, each message's text stays text even
        where it spells one (``special.py``). A message that holds U+FDD0 / U+FDD1,
        or whose role or name spells a control token, is refused (``ValueError``);
        a template that cuts a message's text apart, a ``ChatTemplateError``.
        ``tools`` go to the template as markup: a spec that spells a control
        token is refused too (``ValueError``). ``slot``: the markup each
        ``special.SLOT`` in a message's text stands for (``Marker.mark_messages``)."""
        marker = self.marker()
        rendered = self.apply_chat_template(marker.mark_messages(messages, slot),
                                            add_generation_prompt, limits, marker.mark_tools(tools))
        return self.encode_marked(rendered, bos=False, eos=False)

    def encode_marked(self, rendered: str, bos: bool | None = None,
                      eos: bool | None = None) -> list[int]:
        """The ids of a prompt rendered from ``marker().mark_messages(...)``:
        control tokens matched in the markup only, the text between two of them
        (markup and message text together) tokenized as one fragment."""
        pieces = special.spans(rendered)
        markup = special.MARKS.join(t for is_text, t in pieces if not is_text)
        found = {t: i for t, i in self.markup.items() if t in markup}   # once, not per span
        parts: list[str | int] = []
        for is_text, t in pieces:
            parts += [t] if is_text else special.split_controls(t, found)
        return self._with_ends(self._encode_parts(parts), bos, eos)

    def marker(self) -> "special.Marker":
        """This vocabulary's ``special.Marker`` (built on first use)."""
        if self._marker is None:
            types = self.vocab.token_types or ()
            user = [t for t, k in zip(self.vocab.tokens, types) if k == special.USER_DEFINED]
            self._marker = special.Marker(self.markup, user)
        return self._marker

    def _encode_parts(self, parts: Sequence[str | int]) -> list[int]:
        """Text pieces and control ids to ids: adjacent text joined into one
        fragment, each fragment through the backend, which leaves control-token
        text as text (``encode_special_tokens``) and matches USER_DEFINED tokens."""
        ids: list[int] = []
        text = ""
        for p in list(parts) + [-1]:
            if isinstance(p, str):
                text += p
                continue
            if text:
                ids += self._text_ids(text)
                text = ""
            if p >= 0:
                ids.append(p)
        return ids

    def _text_ids(self, text: str) -> list[int]:
        """The ids of one fragment of text, the text of every markup token
        (``markup``) kept as text."""
        if self._spm:
            return self.backend.encode(text, parse_special=False, markup_as_text=True)
        return self.backend.encode(text, add_special_tokens=False).ids

    def _with_ends(self, ids: list[int], bos: bool | None, eos: bool | None) -> list[int]:
        bos = self.add_bos if bos is None else bos
        eos = self.add_eos if eos is None else eos
        return self._special(bos, "bos") + ids + self._special(eos, "eos")

    def _special(self, wanted: bool, which: str) -> list[int]:
        if not wanted:
            return []
        i = self.bos_id if which == "bos" else self.eos_id
        if i is None:
            raise ValueError(f"{which}=True, but the file names no {PREFIX}{which}_token_id")
        return [i]

    def _check_id(self, i: Any) -> int:
        if isinstance(i, bool) or not hasattr(i, "__index__"):
            raise ValueError(f"token id {i!r} is not an integer")
        i = i.__index__()
        if not 0 <= i < self.vocab_size:
            raise ValueError(f"token id {i} is outside the vocabulary [0, {self.vocab_size})")
        return i


def _controls_as_special(backend: Any, controls: Mapping[str, int],
                         file_types: Sequence[int] | None) -> None:
    """A USER_DEFINED token of the file that llama.cpp makes CONTROL by its
    text (an ``<|im_end|>`` typed USER_DEFINED) is registered as special in
    ``backend``, which then leaves its text as text (``encode_special_tokens``):
    parse_special decides it, as in llama.cpp."""
    from tokenizers import AddedToken

    retyped = [t for t, i in controls.items()
               if file_types is not None and file_types[i] == special.USER_DEFINED]
    if retyped:
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                    for t in retyped])


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a vocabulary's tables are
    built: their hundreds of thousands of objects hold no cycles, and each
    collection that their allocation would set off scans them all again
    (a tenth of Gemma 3's load)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def spm_backend(vocab: VocabMetadata) -> SpmTokenizer:
    """The ``SpmTokenizer`` of a checked "llama" vocabulary."""
    backend = SpmTokenizer(vocab.tokens, vocab.scores, vocab.token_types, vocab.add_space_prefix)
    if len(backend.ids) != len(vocab.tokens):
        # llama.cpp keeps the last id of a repeated text; a file that repeats
        # one is refused here as the "gpt2" path refuses it, not guessed at
        raise MetadataError(f"{PREFIX}tokens has {len(vocab.tokens)} entries but only "
                            f"{len(backend.ids)} distinct tokens; a repeated token is ambiguous")
    return backend


def build_backend(vocab: VocabMetadata) -> Any:
    """The ``tokenizers.Tokenizer`` for checked metadata (see the module docstring):
    the "gpt2" vocabularies' (and the "llama" ones' where a caller asks for it,
    as the tests' comparison of the old path does)."""
    require("tokenizers")
    require("transformers")
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        GGUF_PRE_TOKENIZER_SPLITS, convert_gguf_tokenizer)

    if vocab.model == "gpt2" and vocab.pre not in spm_bpe.SPM_BPE_PRE:
        # A BPE file is split by its pre-tokenizer's regex before any merge; one
        # that transformers does not know would silently get GPT-2's.
        known = sorted(set(GGUF_PRE_TOKENIZER_SPLITS) | {"gpt-2"} | spm_bpe.SPM_BPE_PRE)
        if vocab.pre not in known:
            found = "missing" if vocab.pre is None else f"{vocab.pre!r}"
            raise MetadataError(f"{PREFIX}pre is {found}; the BPE pre-tokenizers supported "
                                f"are {known}")
    # The names transformers' converter reads (its GGUF_TOKENIZER_MAPPING).
    tokenizer_dict: dict[str, Any] = {"tokenizer_type": vocab.model, "tokens": vocab.tokens}
    for name, value in (("scores", vocab.scores), ("token_type", vocab.token_types),
                        ("merges", vocab.merges), ("pre_tokenizer_type", vocab.pre)):
        if value is not None:
            tokenizer_dict[name] = value
    try:
        if vocab.model == "gpt2" and vocab.pre in spm_bpe.SPM_BPE_PRE:
            backend = spm_bpe.backend(vocab)
        else:
            backend, _ = convert_gguf_tokenizer(vocab.architecture, tokenizer_dict)
    except Exception as e:  # the converter's complaint is about these keys' values
        raise MetadataError(f"{PREFIX}*: the {vocab.model!r} tokenizer could not be built "
                            f"from this vocabulary: {type(e).__name__}: {e}") from None

    if vocab.model == "gpt2" and vocab.pre not in spm_bpe.SPM_BPE_PRE:
        backend = _added_tokens_as_written(backend, vocab)
    if vocab.model == "llama":
        _set_space_prefix(backend, vocab.add_space_prefix)
    elif vocab.pre in LLAMA3_FAMILY_PRE:
        backend.model.ignore_merges = True

    backend = _without_tokens_past(backend, len(vocab.tokens))
    backend.no_truncation()   # encode() returns every token of any length
    backend.no_padding()
    n = backend.get_vocab_size(with_added_tokens=True)
    if n != len(vocab.tokens):
        raise MetadataError(f"{PREFIX}tokens has {len(vocab.tokens)} entries but only {n} distinct "
                            f"tokens after conversion; ids past a duplicate would be misread")
    return backend


def _added_tokens_as_written(backend: Any, vocab: VocabMetadata) -> Any:
    """The backend with every CONTROL and USER_DEFINED token of a byte-level
    vocabulary registered at its id, spelled as the file spells it.

    llama.cpp's converter writes an added token as its text ("<｜User｜>") and
    every other token in GPT-2's byte alphabet; llama.cpp matches the added
    ones by that text. transformers' conversion respells a token whose text
    leaves the byte alphabet (here "<ï½ľUserï½ľ>") and registers it only when
    no respelling was needed, so DeepSeek-R1's turn markers were left to the
    BPE, 21 byte pieces where three control ids belong. The vocabulary entry
    of each such id is renamed back to the file's text (the file's own merges
    never build an added token), then registered."""
    import json
    from tokenizers import AddedToken, Tokenizer

    types = vocab.token_types or ()
    have = backend.get_added_tokens_decoder()
    missing = [i for i, k in enumerate(types)
               if k in (special.CONTROL, special.USER_DEFINED) and i not in have]
    if not missing:
        return backend
    data = json.loads(backend.to_str())
    spelled = data["model"]["vocab"]
    by_id = {i: t for t, i in spelled.items()}
    for i in missing:
        text = vocab.tokens[i]
        if spelled.get(text, i) != i:   # checked again below as a count of distinct tokens
            raise MetadataError(f"{PREFIX}tokens: the added token {text!r} (id {i}) is also "
                                f"token {spelled[text]}'s byte-level spelling")
        spelled.pop(by_id.get(i), None)
        spelled[text] = i
    fresh = Tokenizer.from_str(json.dumps(data))
    fresh.add_special_tokens([AddedToken(vocab.tokens[i], special=True, normalized=False)
                              for i in missing if types[i] == special.CONTROL])
    fresh.add_tokens([AddedToken(vocab.tokens[i], special=False, normalized=False)
                      for i in missing if types[i] == special.USER_DEFINED])
    return fresh


def _without_tokens_past(backend: Any, n: int) -> Any:
    """The backend without added tokens the file does not have. transformers'
    tokenizer classes add their default specials (GPT-2's "<|endoftext|>" as
    unk/bos/eos) when the vocabulary lacks them, at ids past the file's last;
    the text "<|endoftext|>" would then encode to an id the model has no row for."""
    added = backend.get_added_tokens_decoder()
    if all(i < n for i in added):
        return backend
    from tokenizers import Tokenizer

    fresh = Tokenizer(backend.model)
    fresh.normalizer, fresh.pre_tokenizer = backend.normalizer, backend.pre_tokenizer
    fresh.decoder = backend.decoder
    keep = [added[i] for i in sorted(added) if i < n]
    fresh.add_special_tokens([t for t in keep if t.special])
    fresh.add_tokens([t for t in keep if not t.special])
    return fresh


def _set_space_prefix(backend: Any, prefix: bool) -> None:
    """llama.cpp's sentencepiece text handling: spaces become "▁", and with the
    prefix on, each run of text gets one more "▁" in front, which decoding takes
    off again."""
    from tokenizers import decoders, normalizers

    to_space = normalizers.Replace(" ", SPACE)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), to_space]) if prefix \
        else to_space
    backend.pre_tokenizer = None
    steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    backend.decoder = decoders.Sequence(steps)
