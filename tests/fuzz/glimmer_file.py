"""The ``glimmer-200k`` fuzz target: a small Muse Glimmer (q4_k_xl lane, 2
layers of width 256) carrying a real byte-level BPE vocabulary of the
release's size, 202,048 tokens, so every attempt parses, checks and builds a
tokenizer as large as the real file's while the weights stay cheap.

The vocabulary is trained here with Hugging Face ``tokenizers``: 200,000
byte-level BPE tokens (Llama 4's split regex, llama.cpp's ``llama4``
pre-tokenizer) learned from this Python's standard-library sources and a
seeded text of pseudo-words in eleven scripts (the sources alone give about
125k merges), then 2,048 special tokens (bos, eos, Muse Glimmer's turn
tokens, reserved ones). Its ``tokenizer.json`` and ``tokenizer_config.json``
(bos, eos, the Muse Glimmer ATEM chat template of the corpus) go through
``convert.vocab.write_vocab``, this project's copy of llama.cpp's converter
(``gpt2``, the tokens, their types, the merges, ``pre``, the special ids, the
template), and ``<|eot|>`` is written as ``eot_token_id``, as the converter
does.

The file is built on first use into ``~/.cache/muser-torch/fuzz-files`` (about a
minute: the training), named by the seed and the Python version whose sources
it learned from, and reused after that.
"""
from __future__ import annotations

import json
import os
import random
import sys
import sysconfig
import tempfile
from pathlib import Path

NAME = "glimmer-200k"
SEED = 20261203
N_TRAINED = 200_000
N_SPECIAL = 2_048                 # the release's vocabulary: 202,048 tokens
PRE = "llama4"
BOS, EOS, EOT = "<|begin_of_text|>", "<|end_of_text|>", "<|eot|>"
NAMED_SPECIALS = (BOS, EOS, "<|start|>", "<|message|>", EOT, "<|eom|>", "<|pad|>")
# (first code point, how many) of the scripts the pseudo-words are drawn from
SCRIPTS = ((0x61, 26), (0x430, 32), (0x3B1, 25), (0x5D0, 27), (0x627, 28), (0x915, 37),
           (0xE01, 46), (0x3041, 86), (0x30A1, 90), (0x4E00, 20_000), (0xAC00, 11_172))
WORDS_PER_SCRIPT = 60_000


def cache_root() -> Path:
    """The project's own cache (``tests/cache_dirs.py``), never the user's."""
    from ..cache_dirs import SHARED
    return SHARED / "fuzz-files"


def glimmer_200k_path() -> Path:
    """The file, built first if the cache lacks it."""
    tag = f"py{sys.version_info.major}{sys.version_info.minor}-seed{SEED}"
    path = cache_root() / f"glimmer-200k-{tag}.gguf"
    if not (path.exists() and trained_json(path).exists()):
        build(path)
    return path


def trained_json(path: Path) -> Path:
    """The trained tokenizer's own ``tokenizer.json``, kept beside the file as
    the reference its GGUF vocabulary is checked against."""
    return path.with_suffix(".tokenizer.json")


def _sources() -> list[Path]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    return sorted(f for f in lib.rglob("*.py") if "site-packages" not in f.parts)


def _pseudo_words(seed: int) -> list[str]:
    """Words of one to four syllables per script, syllables of one to three
    letters, drawn with a Pareto weight so that frequent ones merge first."""
    rng = random.Random(seed)
    out = []
    for base, size in SCRIPTS:
        syllables = ["".join(chr(base + rng.randrange(size)) for _ in range(rng.randint(1, 3)))
                     for _ in range(3000)]
        for _ in range(WORDS_PER_SCRIPT):
            out.append("".join(syllables[min(int(rng.paretovariate(0.8)), len(syllables)) - 1]
                               for _ in range(rng.randint(1, 4))))
    return out


def _corpus(seed: int):
    for f in _sources():
        yield f.read_text(encoding="utf-8", errors="replace")
    words = _pseudo_words(seed)
    for i in range(0, len(words), 1000):
        yield " ".join(words[i:i + 1000])


def train_tokenizer(seed: int = SEED):
    """The trained ``tokenizers.Tokenizer``: 200,000 BPE tokens, then the specials."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_PRE_TOKENIZER_SPLITS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(GGUF_PRE_TOKENIZER_SPLITS[PRE]), "isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=N_TRAINED, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed), trainer)
    if tok.get_vocab_size() != N_TRAINED:
        raise RuntimeError(f"{NAME}: the corpus gave {tok.get_vocab_size()} BPE tokens, "
                           f"not {N_TRAINED}")
    reserved = [f"<|reserved_special_token_{i}|>" for i in range(N_SPECIAL - len(NAMED_SPECIALS))]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in NAMED_SPECIALS + tuple(reserved)])
    return tok


def tokenizer_keys(directory: Path) -> tuple[dict, dict]:
    """The ``tokenizer.*`` keys (and their value types) of the tokenizer saved
    in ``directory``, as the converter writes them."""
    import gguf

    from muser_torch.convert.keys import _to_save_gguf
    from muser_torch.convert.vocab import write_vocab

    w = gguf.GGUFWriter(path=None, arch="muse-glimmer")
    n = N_TRAINED + N_SPECIAL
    write_vocab(w, directory, {"vocab_size": n}, "glimmer", pre_tokenizer=PRE)
    vocab = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in vocab["added_tokens"]}
    w.add_eot_token_id(ids[EOT])
    kv = {k: v for k, v in w.kv_data[0].items() if k.startswith("tokenizer.")}
    return _to_save_gguf(kv)


def build(path: Path, seed: int = SEED) -> None:
    """Train the vocabulary and write the file at ``path`` (atomically)."""
    from muser_torch.arch.muse_glimmer import GlimmerConfig, reference_pattern
    from muser_torch.tiny import write_tiny

    from ..text.family_templates import GLIMMER_ATEM

    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="glimmer-200k-") as tmp:
        d = Path(tmp)
        train_tokenizer(seed).save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
            "pad_token": "<|pad|>", "chat_template": GLIMMER_ATEM}), encoding="utf-8")
        keys, types = tokenizer_keys(d)
        reference = (d / "tokenizer.json").read_bytes()
    config = GlimmerConfig(
        context_length=512, hidden=256, ffn=256, n_layers=2, n_heads=2, n_kv_heads=1,
        head_dim=128, rms_eps=1e-6, sliding_window=64,
        sliding_window_pattern=reference_pattern(2, 2), rope_base=10000.0,
        vocab_size=N_TRAINED + N_SPECIAL, weight_precision="q4_k_xl")
    tmp_path = path.with_name(f"{path.name}.{os.getpid()}")
    write_tiny(tmp_path, config, seed, tokenizer=keys, tokenizer_types=types)
    json_tmp = trained_json(tmp_path)
    json_tmp.write_bytes(reference)
    os.replace(json_tmp, trained_json(path))
    os.replace(tmp_path, path)
