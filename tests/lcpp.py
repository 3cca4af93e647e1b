"""llama.cpp's own numbers for a file, the independent oracle of the tests that
compare with llama.cpp: ``lcpp_logits`` (``tools/peers/lcpp_logits.cpp``,
built by ``tools/peers.sh``; MUSER_LCPP_LOGITS names another build).
Without it those tests skip, saying so."""
from __future__ import annotations

import subprocess

import pytest
import torch

from .peer_bins import binary, is_built, skip_reason

BINARY = binary("lcpp_logits", "MUSER_LCPP_LOGITS")
SKIP_REASON = skip_reason("lcpp_logits", "MUSER_LCPP_LOGITS")
available = is_built(BINARY)


def skip_unless_available() -> None:
    if not available:
        pytest.skip(SKIP_REASON)


def llama_cpp_logits(path, ids: list[int], n_greedy: int, threads: int = 1,
                     timeout: int = 600) -> tuple[torch.Tensor, list[int]]:
    """llama.cpp's last-position logits (float64) and greedy continuation of
    ``ids``; ``CalledProcessError`` (with its stderr) when llama.cpp refuses the file."""
    out = subprocess.run([BINARY, str(path), str(threads), str(n_greedy), *map(str, ids)],
                         capture_output=True, text=True, timeout=timeout, check=True).stdout
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.strip()}
    return (torch.tensor([float(v) for v in lines["LOGITS"]], dtype=torch.float64),
            [int(v) for v in lines["GREEDY"]])


def muser_logits_and_greedy(model, ids: list[int], n_greedy: int) -> tuple[torch.Tensor, list[int]]:
    """muser's side of ``llama_cpp_logits``: the prompt's last-position logits
    (float64) and ``n_greedy`` greedy tokens, through one cache slot."""
    model.setup_cache(1, len(ids) + n_greedy + 1)
    slots = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        logits = model(torch.tensor([ids]), slots)[0, -1].double()
        tokens = [int(logits.argmax())]
        for _ in range(n_greedy - 1):
            tokens.append(int(model(torch.tensor([[tokens[-1]]]), slots)[0, -1].argmax()))
    return logits, tokens


def first_parting(tokens: list[int], ref: list[int]) -> int | None:
    """The first step where two greedy continuations differ (None: never)."""
    return next((i for i, (a, b) in enumerate(zip(tokens, ref)) if a != b), None)


def llama_cpp_tokenize(path, text: str, timeout: int = 600) -> list[int]:
    """llama.cpp's ``llama_tokenize`` of ``text`` (add_special true, parse_special
    false: a control token's text stays text), through ``lcpp_logits``' tokenize mode."""
    out = subprocess.run([BINARY, str(path), "tokenize", text], capture_output=True, text=True,
                         timeout=timeout, check=True).stdout
    line = next(line for line in out.splitlines() if line.startswith("IDS"))
    return [int(v) for v in line.split()[1:]]


def llama_cpp_tokenize_many(path, texts: list[str], parse_special: bool, tmp_dir,
                            timeout: int = 600) -> list[list[int]]:
    """llama.cpp's ``llama_tokenize`` of each text (add_special false: the text's
    own tokens, no BOS), with ``parse_special`` as given, in one model load
    (``lcpp_logits``' tokenize-file mode, which loads the vocabulary only: a
    file of tokenizer keys is enough). Skips, saying to rebuild the peers,
    when the binary predates that mode."""
    return llama_cpp_tokenize_many_flags(path, [(t, parse_special) for t in texts], tmp_dir, timeout)


def llama_cpp_tokenize_many_flags(path, texts: list[tuple[str, bool]], tmp_dir,
                                  timeout: int = 600) -> list[list[int]]:
    """``llama_cpp_tokenize_many`` with each text's own ``parse_special``: ``(text, flag)`` pairs."""
    skip_unless_available()
    records = b"".join((b"1" if flag else b"0") + t.encode("utf-8") + b"\0" for t, flag in texts)
    if any(b"\0" in t.encode("utf-8") or not t for t, _ in texts):
        raise ValueError("tokenize-file takes non-empty texts without NUL")
    src = tmp_dir / "texts.bin"
    src.write_bytes(records)
    out = subprocess.run([BINARY, str(path), "tokenize-file", str(src)], capture_output=True,
                         text=True, timeout=timeout)
    lines = [line for line in out.stdout.splitlines() if line.startswith("IDS")]
    if out.returncode != 0 and not lines:
        pytest.skip(f"{BINARY} has no tokenize-file mode or loads more than the vocabulary "
                    f"(built before they were added): rebuild it with tools/peers.sh --force")
    assert out.returncode == 0 and len(lines) == len(texts), out.stderr[-2000:]
    return [[int(v) for v in line.split()[1:]] for line in lines]
