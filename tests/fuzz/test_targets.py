"""The fuzz targets built here (targets.py, glimmer_file.py): glimmer-200k
carries the BPE it was trained with, as the converter writes one, and a split
target's mutant changes one part, never the original parts."""
from __future__ import annotations

import hashlib
import json
import random
import sysconfig
from pathlib import Path

from muser_torch import load_gguf

from ..gguf.helpers import fresh_seed
from ..text.family_templates import GLIMMER_ATEM
from .glimmer_file import N_SPECIAL, N_TRAINED, glimmer_200k_path, trained_json
from .glimmer_file import SCRIPTS as SCRIPT_RANGES
from .mutate import materialize
from .targets import Target, demo_split3_path, part_paths

NORMAL, CONTROL = 1, 3   # llama.cpp token types


def test_glimmer_200k_holds_its_trained_bpe_as_the_converter_writes_it():
    path = glimmer_200k_path()
    reference = json.loads(trained_json(path).read_text(encoding="utf-8"))
    by_id = sorted({**reference["model"]["vocab"],
                    **{t["content"]: t["id"] for t in reference["added_tokens"]}}.items(),
                   key=lambda kv: kv[1])
    md = load_gguf(path).metadata
    tokens = md["tokenizer.ggml.tokens"]
    assert (md["tokenizer.ggml.model"], md["tokenizer.ggml.pre"]) == ("gpt2", "llama4")
    assert len(tokens) == N_TRAINED + N_SPECIAL == 202_048
    assert tokens == [t for t, _ in by_id] and [i for _, i in by_id] == list(range(len(tokens)))
    assert md["tokenizer.ggml.token_type"] == [NORMAL] * N_TRAINED + [CONTROL] * N_SPECIAL
    merges = [m if isinstance(m, str) else " ".join(m) for m in reference["model"]["merges"]]
    assert md["tokenizer.ggml.merges"] == merges
    for key, text in (("bos", "<|begin_of_text|>"), ("eos", "<|end_of_text|>"),
                      ("eot", "<|eot|>"), ("padding", "<|pad|>")):
        assert tokens[md[f"tokenizer.ggml.{key}_token_id"]] == text, key
    assert md["tokenizer.chat_template"] == GLIMMER_ATEM


def test_glimmer_200k_tokenizes_as_its_trained_bpe():
    """The tokenizer muser_torch builds from the file's keys gives the ids of
    the trained ``tokenizers.Tokenizer`` (the independent reference) on
    fresh text: standard-library source, pseudo-words of the training
    scripts, and random characters beyond them."""
    import torch
    from tokenizers import Tokenizer

    from muser_torch import from_gguf
    path = glimmer_200k_path()
    reference = Tokenizer.from_file(str(trained_json(path)))
    tok = from_gguf(path, dtype=torch.float32).tokenizer
    seed = fresh_seed()
    rng = random.Random(seed)
    sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts = []
    for _ in range(12):
        src = rng.choice(sources).read_text(encoding="utf-8", errors="replace")
        at = rng.randrange(max(1, len(src) - 2000))
        texts.append(src[at:at + rng.randint(1, 2000)])
    for _ in range(12):
        base, size = rng.choice(SCRIPT_RANGES)
        texts.append(" ".join("".join(chr(base + rng.randrange(size))
                                      for _ in range(rng.randint(1, 9))) for _ in range(40)))
        texts.append("".join(chr(rng.choice([rng.randrange(0x20, 0x2FFF),
                                             rng.randrange(0x1F300, 0x1FAFF)]))
                             for _ in range(200)))
    for text in texts:
        want = reference.encode(text, add_special_tokens=False).ids
        assert tok.encode(text, bos=False, eos=False) == want, f"seed {seed}: {text[:80]!r}"
        assert tok.decode(want) == text, f"seed {seed}: {text[:80]!r}"


def _digest(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_a_split_mutant_changes_one_part_and_no_original(tmp_path):
    """Each mutant is written as its part, beside links to the other parts;
    the stages open the first part's name; the original parts stay as they were."""
    first = demo_split3_path()
    parts = part_paths(first)
    assert len(parts) == 3 and all(p.exists() for p in parts)
    before = [_digest(p) for p in parts]
    target = Target(first)
    slot = tmp_path / "slot0.gguf"
    seed = fresh_seed()
    seen = set()
    for i in range(60):
        k, m = target.mutant(seed, i, with_sweep=False)
        assert m.detail.startswith(f"part {k + 1} of 3: "), m.detail
        seen.add(k)
        run = target.write(k, m, slot)
        assert run.name == parts[0].name
        want = tmp_path / "want.gguf"
        materialize(target.parts[k].lay, m, want, target.parts[k].data)
        for j, p in enumerate(parts):
            got = run.with_name(p.name)
            if j == k:
                assert not got.is_symlink() and got.read_bytes() == want.read_bytes(), (seed, i)
            else:
                assert got.is_symlink() and got.resolve() == p.resolve(), (seed, i, j)
    assert seen == {0, 1, 2}, f"seed {seed}: parts drawn {seen}"
    assert [_digest(p) for p in parts] == before
    # the sweep walks each part in turn
    n = [len(p.items) for p in target.parts]
    assert target.n_sweep == sum(n) and all(n)
    assert target.mutant(seed, n[0], with_sweep=True)[0] == 1
    assert target.mutant(seed, sum(n) - 1, with_sweep=True)[0] == 2
