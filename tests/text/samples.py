"""Text to tokenize: fixed multilingual fragments and random strings drawn from a seed."""
from __future__ import annotations

import random

from ..random_seed import fresh_seed  # noqa: F401 (its tests import it from here)

FRAGMENTS = (
    "Héllo wörld! Ça va? Crème brûlée, naïve façade, São Paulo, Øresund, İstanbul.",
    "日本語のテキストと漢字、カタカナ。中文数据模型。한국어 문장입니다.",
    "Привет, мир! Съешь же ещё этих мягких французских булок.",
    "def f(x: int) -> int:\n\treturn x ** 2  # square\n\n\nclass A:\n    pass\n",
    "if (a != b && c <= 0x1F) { printf(\"%d\\n\", a[i]); }",
    "tabs\tin\t\tthe\tmiddle and  double  spaces   and\r\nwindows lines",
    "emoji 🎉🚀👩‍💻 flags 🇫🇷 and symbols ∑ √ ∞ € £ ¥ ©",
    "   leading spaces, then trailing   ",
    "\n\nleading newlines",
    "numbers 1234567890 3.14159 -42 1e-9 2026-12-01",
    "ﬁ ligature, ① circled, Ⅻ roman, ǅ title case, e\u0301 combining",
    "",
)

# One sample per script or kind of text, for comparing a converted file's
# tokenizer with its checkpoint's: English, French, German, Chinese, Japanese,
# Korean, Arabic, Hindi, Russian, emoji, code, mixed whitespace.
MULTILINGUAL = (
    "The quick brown fox jumps over the lazy dog. It's 3:45 p.m., isn't it?",
    "Où est la bibliothèque ? Je voudrais un café crème, s'il vous plaît.",
    "Größere Straßenbahnhaltestellen überqueren: Fußgänger müssen aufpassen.",
    "我们今天去公园散步，天气很好。机器学习模型需要大量数据。",
    "東京は日本の首都です。ひらがなとカタカナ、漢字を使います。",
    "안녕하세요, 만나서 반갑습니다. 오늘 날씨가 좋네요.",
    "مرحبا بالعالم، كيف حالك اليوم؟",
    "नमस्ते दुनिया, आप कैसे हैं?",
    "Съешь же ещё этих мягких французских булок, да выпей чаю.",
    "Party time 🎉🚀 family 👨‍👩‍👧 flag 🇯🇵 skin 👍🏽 ✨",
    "def f(x: int) -> int:\n    return x ** 2  # square\n\nprint(f(0x1F), [i for i in range(3)])\n",
    "tabs\tand\t\tdouble  spaces   then\nnewlines\n\n\nand\r\nwindows \t \n trailing  ",
)

# Ranges random text is drawn from: ASCII, Latin-1, Latin Extended, Cyrillic,
# Greek, CJK, Hiragana, Hangul, emoji, and whitespace.
_RANGES = ((0x20, 0x7E), (0xC0, 0xFF), (0x100, 0x17F), (0x400, 0x45F), (0x391, 0x3C9),
           (0x4E00, 0x4FFF), (0x3041, 0x3096), (0xAC00, 0xAC80), (0x1F600, 0x1F64F))
_WHITESPACE = (" ", "  ", "\t", "\n", "\n\n", " \n")


def random_texts(seed: int, n: int = 24) -> list[str]:
    """Strings of random words from the ranges above, mixed with pieces of the
    fragments, separated by random whitespace (leading whitespace included)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 10)):
            if rng.random() < 0.3:
                frag = rng.choice(FRAGMENTS)
                a = rng.randrange(len(frag) + 1)
                parts.append(frag[a:a + rng.randint(1, 30)])
            else:
                lo, hi = rng.choice(_RANGES)
                parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 8))))
            parts.append(rng.choice(_WHITESPACE))
        start = rng.choice(("", "", " ", "\n", "  "))
        out.append(start + "".join(parts))
    return out


def all_samples(seed: int) -> list[str]:
    return list(FRAGMENTS) + random_texts(seed)


# Text for the comparisons with llama.cpp's tokenizer (test_spm_llama_cpp.py,
# test_bpe_llama_cpp.py): C code with tabs, emoji sequences, runs of whitespace.
CODE = '''#include <stdio.h>
int main(void) {
\tfor (int i = 0; i < 10; ++i) {   // count
\t\tprintf("%d\\n", i * i);
\t}
\treturn 0;   /* done */
}
'''
EMOJI = "🎉🚀👩‍💻🇫🇷👍🏽✨ 🙂🙃 ⚙️ 🧑🏿‍🚀 \U0001FAE0 \U000E0041"   # a tag character: byte fallback


def whitespace_runs() -> list[str]:
    """Runs of one whitespace kind around the longest run token (31), between
    letters, alone and mixed; and a long mixed run."""
    out = []
    for ch in (" ", "\t", "\n"):
        for n in (1, 2, 3, 15, 16, 30, 31, 32, 33, 35, 61, 62, 63, 64, 100):
            out += [f"a{ch * n}b", ch * n, f"{ch * n}x{ch * n}"]
    out += [" \t\n" * 20, "\n \n  \n   \n" * 5, "x" + " \t" * 40 + "y", "\r\n" * 9 + "\r" * 3]
    return out
