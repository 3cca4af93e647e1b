"""The block layouts as Triton constants, read from ``formats/layout.py``.

Every number ``layout_constants()`` derives becomes a module constant of the
same name wrapped in ``tl.constexpr`` (the only kind of global a Triton kernel
may read): ``{TYPE}_BYTES`` and ``{TYPE}_ELEMS`` of a block, ``{TYPE}_{FIELD}``
the byte offset of a field (``Q4_K_QS``, ``Q6_K_D``, ...), and the shared
``QK_K``, ``QK_LEGACY``, ``NVFP4_GROUP``. Each GGML type's id is a constant
named after the type (``Q4_K``), for the kernels' ``QTYPE`` branches. No
offset is typed anywhere in the Triton kernels; they import these names.
"""
from __future__ import annotations

import triton.language as tl

from ...formats.iq_grids import IQ3S_GRID, IQ3XXS_GRID
from ...formats.layout import IQ4_VALUES, layout_constants
from ...formats.types import GGMLType

_CONSTANTS = {name: tl.constexpr(value) for name, value in layout_constants().items()}
_TYPE_IDS = {t.name: tl.constexpr(int(t)) for t in GGMLType}
globals().update(_CONSTANTS)
globals().update(_TYPE_IDS)

# Columns one kernel tile decodes: a K-quant super-block, 8 legacy blocks,
# 16 NVFP4 groups. Every block size the kernels take divides it.
TILE = tl.constexpr(layout_constants()["QK_K"])

# The IQ4 value table as four int32 words of four signed bytes (little endian,
# code 4w + b in byte b of word w): Triton kernels read no constant arrays.
_IQ4_BYTES = bytes(v & 0xFF for v in IQ4_VALUES)
IQ4_WORDS = tuple(tl.constexpr(int.from_bytes(_IQ4_BYTES[4 * w:4 * w + 4], "little", signed=True))
                  for w in range(4))
IQ4_W0, IQ4_W1, IQ4_W2, IQ4_W3 = IQ4_WORDS

# The IQ3 grids are too large for constants: the host passes them to the
# kernels as an int32 tensor (every word is below 2**31), in the scales' place.
GRID_WORDS = {GGMLType.IQ3_XXS: IQ3XXS_GRID, GGMLType.IQ3_S: IQ3S_GRID}

__all__ = sorted([*_CONSTANTS, *_TYPE_IDS, "TILE", "require", "IQ4_W0", "IQ4_W1", "IQ4_W2",
                  "IQ4_W3", "GRID_WORDS"])


def require(condition: bool, what: str) -> None:
    """Refuse to import kernels whose word loads assume something about a layout
    that ``formats/layout.py`` does not declare (the Metal prelude's static_asserts,
    for Triton)."""
    if not condition:
        raise RuntimeError(f"the Triton kernels assume {what}, which formats/layout.py "
                           f"does not declare")


for _t in GGMLType:
    if _t.block_elems > 1 and layout_constants()["QK_K"] % _t.block_elems:
        raise RuntimeError(f"{_t.name}: a {_t.block_elems}-element block does not divide the "
                           f"{layout_constants()['QK_K']}-column kernel tile")
