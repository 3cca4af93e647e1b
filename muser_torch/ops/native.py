"""The CPU library's entry points that the model layer may call: the
one-call decode block (``cpu/decode.c`` through ``cpu/block.py``) and the
eager shortcuts (``cpu/eager.py``). Re-exported here so ``models/`` asks
``ops``, never a backend folder (``tools/import_graph.py`` checks it)."""
from __future__ import annotations

from .cpu import BACK_TO_BACK_THREAD_MIN_BYTES, FUSED_MAX_TOKENS  # noqa: F401
from .cpu import block  # noqa: F401
from .cpu.build import _native_lib as native_lib  # noqa: F401
from .cpu.eager import plain_eager, profiling, recorded  # noqa: F401
