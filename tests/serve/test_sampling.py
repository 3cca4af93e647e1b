"""Stop strings and settling text, on fresh random data against plain references:
the text cut at the first stop string to complete, and the tokenizer's decode
of every id."""
from __future__ import annotations

import random

import pytest

from muser_torch.serve.sampling import StopStrings
from muser_torch.text.byte_tokenizer import ByteTokenizer
from muser_torch.text.stream import TextStream

from ..random_seed import fresh_seed

SEED = fresh_seed()


def _pieces(rng: random.Random, text: str) -> list[str]:
    cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(0, 12)))) \
        if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def _first_stop(text: str, ends: list[int], stops: tuple[str, ...]) -> tuple[str, bool]:
    """The reference: at the first piece boundary where some stop string is
    complete, the text before the earliest-starting complete one."""
    for end in ends:
        starts = [i for i in (text[:end].find(s) for s in stops) if i >= 0]
        if starts:
            return text[:min(starts)], True
    return text, False


def test_stop_strings_cut_at_the_first_complete_one_and_never_release_past_it():
    rng = random.Random(SEED)
    for case in range(2000):
        text = "".join(rng.choice("abc<|>") for _ in range(rng.randint(0, 40)))
        stops = tuple("".join(rng.choice("abc<|>") for _ in range(rng.randint(1, 5)))
                      for _ in range(rng.randint(1, 3)))
        pieces = _pieces(rng, text)
        want, stopped = _first_stop(text, [len("".join(pieces[:k + 1])) for k in range(len(pieces))],
                                    stops)
        s = StopStrings(stops)
        out, hit = "", False
        for piece in pieces:
            released, hit = s.feed(piece)
            out += released
            assert want.startswith(out), f"seed {SEED} case {case}: released {out!r} past {want!r}"
            if hit:
                break
        if not hit:
            out += s.flush()
        assert (out, hit) == (want, stopped), f"seed {SEED} case {case}: {pieces!r} {stops!r}"


def test_without_stop_strings_everything_is_released_at_once():
    s = StopStrings(())
    assert s.feed("abc") == ("abc", False) and s.flush() == ""


def test_empty_stop_string_is_refused():
    with pytest.raises(ValueError, match="must not be empty"):
        StopStrings(("a", ""))


def _random_text(rng: random.Random, n: int) -> str:
    alphabet = "ab ,\n\u00e9\u4e2d\U0001f600"   # 1- to 4-byte UTF-8 characters
    return "".join(rng.choice(alphabet) for _ in range(n))


def _check_stream(tok, ids: list[int]) -> None:
    stream = TextStream(tok)
    pieces = [stream.push(i) for i in ids]
    pieces.append(stream.finish())
    assert "".join(pieces) == tok.decode(ids), f"seed {SEED}"
    assert all("\ufffd" not in p for p in pieces[:-1]), f"seed {SEED}: a half character released"


def test_text_stream_releases_whole_characters_of_byte_tokens():
    rng = random.Random(SEED)
    tok = ByteTokenizer()
    for _ in range(50):
        _check_stream(tok, tok.encode(_random_text(rng, rng.randint(1, 30)), bos=False))


def test_text_stream_on_gemma_tokens(gemma_model):
    rng = random.Random(SEED)
    tok = gemma_model.tokenizer
    for _ in range(20):
        _check_stream(tok, tok.encode(_random_text(rng, rng.randint(1, 30)), bos=False))
