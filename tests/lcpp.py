"""llama.cpp's own numbers for a file, the independent oracle of the tests that
compare with llama.cpp: ``lcpp_logits`` (built by
``shared/tools/peers/build_lcpp_logits.sh``), named by MUSER_LCPP_LOGITS.
Without it those tests skip."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

BINARY = os.environ.get("MUSER_LCPP_LOGITS")
SKIP_REASON = "set MUSER_LCPP_LOGITS to llama.cpp's lcpp_logits binary"
available = bool(BINARY) and Path(BINARY).is_file()


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
