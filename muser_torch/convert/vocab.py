"""The ``tokenizer.*`` keys of a converted file, as llama.cpp's converter writes
them from ``tokenizer.model`` / ``tokenizer.json`` / ``tokenizer_config.json``.

Three vocabularies, each the converter's:

* sentencepiece (``tokenizer.model``): ``tokenizer.ggml.model = "llama"``,
  every piece with its score and type, padded to the config's vocab_size with
  ``[PADn]`` UNUSED tokens, then the added tokens of ``added_tokens.json``
  and ``tokenizer_config.json``'s ``added_tokens_decoder``;
* BPE (``tokenizer.json``): ``"gpt2"``, the vocabulary by id (holes as
  ``[PADn]``), added tokens CONTROL or USER_DEFINED, merges, and the
  pre-tokenizer named by the hash of the ids the tokenizer gives a fixed
  probe text (``pretokenizers.txt``). A hash not listed is refused, as the
  converter refuses it; ``pre_tokenizer=`` names it explicitly instead. A
  sentencepiece-style BPE (byte fallback, U+2581 for a space: Gemma's
  ``tokenizer.json``) is llama.cpp's "gemma4" family; Gemma 3's own hash is
  listed as "granite-embed-multi-311m", which llama.cpp reads the same way.

A Llama-family ``tokenizer.json`` converted from sentencepiece, without its
``tokenizer.model``, is refused: llama.cpp's converter writes it as a
sentencepiece vocabulary whose scores are all -1000 (gguf-py's
``LlamaHfVocab`` has no merge ranks to give), and that file tokenizes
differently from the checkpoint.

Special ids, add_bos/add_eos, merges and the chat template come from gguf-py's
``SpecialVocab``, the converter's own reader of those files. Keys go into a
gguf-py ``GGUFWriter`` used as an ordered key collector.
"""
from __future__ import annotations

import functools
import json
from hashlib import sha256
from pathlib import Path
from typing import Any

from ..errors import TokenizerConvertError

__all__ = ["write_vocab", "pre_tokenizer_name", "KNOWN_PRE_TOKENIZERS"]

# The probe text whose token ids identify a BPE pre-tokenizer (llama.cpp's chktxt).
CHECK_TEXT = ("\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n\U0001f680 (normal) \U0001f636\u200d"
              "\U0001f32b\ufe0f (multiple emojis concatenated) \u2705 \U0001f999\U0001f999 3 33 333 3333 "
              "33333 333333 3333333 33333333 3.3 3..3 3...3 \u1780\u17b6\u1793\u17cb\u178f\u17c2"
              "\u1796\u17b7\u179f\u17c1\u179f\u17a2\u17b6\u1785\U0001f601 ?\u6211\u60f3\u5728apple"
              "\u5de5\u4f5c1314151\u5929\uff5e ------======= \u043d\u0435\u0449\u043e \u043d\u0430 "
              "\u0411\u044a\u043b\u0433\u0430\u0440\u0441\u043a\u0438 ''''''```````\"\"\"\"......!!!!!!"
              "?????? I've been 'told he's there, 'RE you sure? 'M not sure I'll make it, 'D you like "
              "some tea? We'Ve a'lL")

# token types (gguf-py's TokenType)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_SPACE = "\u2581"


@functools.lru_cache(maxsize=None)
def _known() -> dict[str, str]:
    path = Path(__file__).with_name("pretokenizers.txt")
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            digest, name = line.split()
            out[digest] = name
    return out


def KNOWN_PRE_TOKENIZERS() -> frozenset[str]:
    return frozenset(_known().values())


def pre_tokenizer_name(tokenizer: Any, directory: Path) -> str:
    """llama.cpp's name of a BPE tokenizer's pre-tokenizer, from the hash of the
    ids it gives ``CHECK_TEXT``; TokenizerConvertError when not one it knows."""
    digest = sha256(str(tokenizer.encode(CHECK_TEXT)).encode()).hexdigest()
    name = _known().get(digest)
    if name is None:
        hint = ("'gemma4': it is a sentencepiece-style BPE, as Gemma's" if is_sentencepiece_bpe(directory)
                else "one of llama.cpp's names, e.g. 'llama-bpe', 'qwen2'")
        raise TokenizerConvertError(
            f"{directory}: the BPE pre-tokenizer of tokenizer.json is not one llama.cpp's converter "
            f"identifies (hash {digest}); it would be written wrong, so it is refused. If you know "
            f"which it is, name it with --pre-tokenizer ({hint})")
    return name


def _looks_special(text: str) -> bool:
    """Added tokens the converter marks CONTROL even when not flagged special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<\uff5c") and text.endswith("\uff5c>"))
            or (text.startswith("<unused") and text.endswith(">")))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerConvertError(f"{path}: cannot be read ({e})") from None


# ---- sentencepiece -----------------------------------------------------------------

def _sentencepiece(directory: Path, hparams: dict) -> tuple[list[bytes], list[float], list[int]]:
    from sentencepiece import SentencePieceProcessor
    sp = SentencePieceProcessor()
    try:
        sp.LoadFromFile(str(directory / "tokenizer.model"))
    except (OSError, RuntimeError) as e:
        raise TokenizerConvertError(f"{directory / 'tokenizer.model'}: not a sentencepiece model ({e})") from None
    n = hparams.get("vocab_size_per_layer_input") or hparams.get("vocab_size") or sp.vocab_size()
    tokens = [f"[PAD{i}]".encode() for i in range(n)]
    scores, types = [-10000.0] * n, [UNUSED] * n
    for i in range(min(sp.vocab_size(), n)):
        tokens[i] = sp.IdToPiece(i).encode("utf-8")
        scores[i] = sp.GetScore(i)
        types[i] = (UNKNOWN if sp.IsUnknown(i) else CONTROL if sp.IsControl(i)
                    else UNUSED if sp.IsUnused(i) else BYTE if sp.IsByte(i) else NORMAL)
    added = directory / "added_tokens.json"
    if added.is_file():
        for text, i in _read_json(added).items():
            if i < n:
                tokens[i], scores[i], types[i] = text.encode("utf-8"), -1000.0, USER_DEFINED
    config = directory / "tokenizer_config.json"
    if config.is_file():
        for key, data in (_read_json(config).get("added_tokens_decoder") or {}).items():
            i, text = int(key), data["content"]
            if i >= n:
                continue
            if data.get("special") or _looks_special(text):
                types[i] = CONTROL
            else:
                text = text.replace(_SPACE, " ")
                types[i] = USER_DEFINED
            scores[i], tokens[i] = -1000.0, text.encode("utf-8")
    return tokens, scores, types


def _write_spm(writer: Any, directory: Path, tokens: list, scores: list, types: list) -> None:
    import gguf
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(directory, n_vocab=len(tokens)).add_to_gguf(writer, quiet=True)
    _normalizer_keys(writer, directory)


# ---- byte-level BPE ----------------------------------------------------------------

def _gpt2(writer: Any, directory: Path, hparams: dict, pre_tokenizer: str | None) -> None:
    import gguf
    from transformers import AutoTokenizer
    try:
        tok = AutoTokenizer.from_pretrained(str(directory))
    except Exception as e:
        raise TokenizerConvertError(f"{directory}: transformers cannot load the tokenizer ({e})") from None
    vocab = tok.vocab
    n = hparams.get("vocab_size", len(vocab))
    if max(vocab.values()) >= n:
        raise TokenizerConvertError(f"{directory}: tokenizer id {max(vocab.values())} is outside "
                                    f"config.json's vocab_size {n}")
    pre = pre_tokenizer or pre_tokenizer_name(tok, directory)
    by_id = {i: t for t, i in vocab.items()}
    added, decoder = tok.get_added_vocab(), tok.added_tokens_decoder
    tokens, types = [], []
    for i in range(n):
        text = by_id.get(i)
        if text is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
            continue
        if text not in added:
            types.append(NORMAL)
        else:
            if not decoder[i].normalized:   # llama.cpp expects added tokens pre-normalized
                text = tok.decode(tok.encode(text, add_special_tokens=False))
            if decoder[i].special or _looks_special(text):
                types.append(CONTROL)
            else:
                text = text.replace(_SPACE, " ")
                types.append(USER_DEFINED)
        tokens.append(text)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(directory, load_merges=True).add_to_gguf(writer, quiet=True)
    _normalizer_keys(writer, directory)


def _normalizer_keys(writer: Any, directory: Path) -> None:
    """``tokenizer.ggml.normalizer.lowercase`` / ``.strip_accents`` from
    tokenizer.json's normalizer (Lowercase, StripAccents, BertNormalizer's
    flags, inside Sequences too), after the special-vocabulary keys, as the
    converter's SpecialVocab adds them (gguf-py 0.19's does not yet)."""
    path = directory / "tokenizer.json"
    if not path.is_file():
        return
    flags: dict[str, bool] = {}

    def walk(n: Any) -> None:
        if not isinstance(n, dict):
            return
        kind = n.get("type")
        if kind == "Lowercase":
            flags["lowercase"] = True
        elif kind == "StripAccents":
            flags["strip_accents"] = True
        elif kind == "BertNormalizer":
            for k in ("lowercase", "strip_accents"):
                if k in n:
                    flags[k] = n[k]
        elif kind == "Sequence":
            for m in n.get("normalizers", []):
                walk(m)
    walk(_read_json(path).get("normalizer"))
    for k in ("lowercase", "strip_accents"):
        if flags.get(k) is not None:
            writer.add_bool(f"tokenizer.ggml.normalizer.{k}", flags[k])


# ---- per architecture ----------------------------------------------------------------

def write_vocab(writer: Any, directory: Path, hparams: dict, family: str,
                pre_tokenizer: str | None = None) -> None:
    """Add the tokenizer keys of ``family`` ("llama", "qwen", "gemma3", "glimmer")
    in the converter's order."""
    has_spm = (directory / "tokenizer.model").is_file()
    has_json = (directory / "tokenizer.json").is_file()
    if not has_spm and not has_json:
        raise TokenizerConvertError(f"{directory}: neither tokenizer.model nor tokenizer.json; "
                                    f"a converted file must carry its tokenizer")
    if family == "llama":
        config = directory / "tokenizer_config.json"
        if config.is_file():
            prefix = _read_json(config).get("add_prefix_space")
            if prefix is not None:
                writer.add_add_space_prefix(prefix)
        if has_spm:
            _write_spm(writer, directory, *_sentencepiece(directory, hparams))
        elif is_sentencepiece_bpe(directory):
            raise TokenizerConvertError(
                f"{directory}: tokenizer.json is a sentencepiece-style BPE without its tokenizer.model; "
                f"llama.cpp's converter writes it with no merge ranks (every score -1000), so the file "
                f"would tokenize differently from the checkpoint: add the checkpoint's tokenizer.model")
        else:
            _gpt2(writer, directory, hparams, pre_tokenizer)
        return
    if has_spm:
        _write_spm(writer, directory, *_sentencepiece(directory, hparams))
        if family == "gemma3":
            writer.add_add_space_prefix(False)
    else:
        _gpt2(writer, directory, hparams, pre_tokenizer)


def is_sentencepiece_bpe(directory: Path) -> bool:
    """tokenizer.json is a BPE converted from sentencepiece: byte fallback, and a
    decoder sequence (U+2581 back to a space, bytes fused)."""
    tj = _read_json(directory / "tokenizer.json")
    model = tj.get("model", {})
    return (model.get("type") == "BPE" and bool(model.get("byte_fallback", False))
            and (tj.get("decoder") or {}).get("type") == "Sequence")


def spm_vocab_size(directory: Path, hparams: dict) -> int:
    """How many tokens the sentencepiece vocabulary has (Gemma 3 trims its embedding to it)."""
    return len(_sentencepiece(directory, hparams)[0])


def json_vocab_size(directory: Path) -> int:
    """tokenizer.json's token count: its vocabulary plus its added tokens."""
    tj = _read_json(directory / "tokenizer.json")
    return len(tj["model"]["vocab"]) + len(tj.get("added_tokens", []))
