"""Model-loader failures. ``KNOWN_LOADER_FAILURES`` lists the open
ones: a bad outcome (untyped, crash, hang, over-cap) on a mutant that matches
one is counted under its name instead of failing the run. It is empty: no bad
outcome is excused. ``LOADER_REGRESSIONS`` keeps the mutants of three
failures the harness found, which every run replays and ``test_fuzz`` holds to ok or typed.

Each entry names the metadata keys whose mutation shows the failure, the
stage it happens in, and the reason.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    name: str
    keys: tuple[str, ...]     # a mutant touching one of these keys ...
    stages: tuple[str, ...]   # ... that goes bad in one of these stages
    reason: str
    replay: tuple[str, str]   # (key, sweep label): the mutant the xfail test runs


LOADER_REGRESSIONS: tuple[Known, ...] = (
    Known("block_count_huge", ("muse-glimmer.block_count",), ("model",),
          "the expected-tensor list is built for every claimed layer before it is compared "
          "with the tensors in the file: u32 max never returns / runs out of memory",
          ("muse-glimmer.block_count", "u32 max")),
    Known("sliding_window_huge_float", ("muse-glimmer.attention.sliding_window",), ("generate",),
          "an integral FLOAT64 like 1e308 is admitted as the window, then the mask code "
          "raises OverflowError in generate",
          ("muse-glimmer.attention.sliding_window", "1e308 FLOAT64")),
    Known("tokenizer_inf", ("tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                            "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"),
          ("model",),
          "a FLOAT32 +-inf where the byte tokenizer compares integers (bos/eos ids, tokens, "
          "token types) leaks OverflowError from int() (only ValueError is converted to "
          "MetadataError)",
          ("tokenizer.ggml.bos_token_id", "+inf FLOAT32")),
)

# Chat templates that hang or exhaust the machine when a render is unbounded. Replayed on every file (they render only where the file's
# tokenizer has a chat template: the Gemma file, not the byte-level demos),
# held to a typed ChatTemplateError in the chat stage where they render.
TEMPLATE_REGRESSIONS: tuple[Known, ...] = tuple(
    Known(f"template_{name}", ("tokenizer.chat_template",), ("chat",), reason,
          ("tokenizer.chat_template", f"hostile: {label}"))
    for name, label, reason in (
        ("nested_ranges", "three nested range(99999)", "no end after 60 s"),
        ("huge_repeat", "'x' * 3000000000", "no end after 60 s, gigabytes allocated"),
        ("doubling", "a string doubled 40 times", "no end after 60 s"),
        ("self_macro", "a macro calling itself", "a RecursionError after 10 s"),
    ))

KNOWN_LOADER_FAILURES: tuple[Known, ...] = ()


def match(touches: tuple[str, ...], stage: str | None) -> str | None:
    """The name of the known failure a bad outcome belongs to, if any."""
    for k in KNOWN_LOADER_FAILURES:
        if stage in k.stages and any(key in t.split() for t in touches for key in k.keys):
            return k.name
    return None
