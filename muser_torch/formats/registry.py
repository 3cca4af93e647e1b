"""Block formats register here; ``dequantize`` and ``quantize`` dispatch on type.

A format class writes only ``dequantize_blocks`` (uint8 ``[n, block_bytes]``
to float32 ``[n, block_elems]``) and, where it can, ``quantize_blocks``; the
public functions in ``muser_torch.formats`` reshape rows into blocks and
validate inputs, so every format gets the same checks and messages.
"""
from __future__ import annotations

import functools
from typing import ClassVar

import torch

from .types import GGMLType

_FORMATS: dict[GGMLType, type["BlockFormat"]] = {}


class BlockFormat:
    qtype: ClassVar[GGMLType]

    def __init_subclass__(cls, qtype: GGMLType | None = None, **kw) -> None:
        super().__init_subclass__(**kw)
        if qtype is None:
            return
        if qtype in _FORMATS:
            raise RuntimeError(f"{qtype.name} registered twice")
        cls.qtype = qtype
        _FORMATS[qtype] = cls

    @classmethod
    def field(cls, blocks: torch.Tensor, name: str) -> torch.Tensor:
        """Field ``name`` of every block, uint8 ``[n, nbytes]`` (offsets from ``layout.py``)."""
        return field_of(blocks, cls.qtype, name)

    @classmethod
    def f16(cls, blocks: torch.Tensor, name: str) -> torch.Tensor:
        """The f16 field ``name`` of every block, as float32 ``[n, 1]``."""
        return f16_field(blocks, cls.qtype.layout.field(name).offset)

    @classmethod
    def dequantize_blocks(cls, blocks: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def quantize_blocks(cls, blocks: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
        """float32 ``[n, block_elems]`` (and optional importance ``weights`` of
        the same shape) to uint8 ``[n, block_bytes]``."""
        raise NotImplementedError(f"quantize to {cls.qtype.name} is not supported")

    @classmethod
    def quantize_rows(cls, x: torch.Tensor, imatrix: torch.Tensor | None) -> torch.Tensor:
        """float32 ``[rows, n_in]`` (and optional importance ``imatrix`` ``[n_in]``)
        to uint8 ``[rows, row_bytes]``. Cuts rows into blocks for
        ``quantize_blocks``; a format whose weighting looks at the whole row
        (ggml's legacy imatrix paths use the row's mean square) overrides it."""
        rows, n_in = x.shape
        blocks = x.reshape(-1, cls.qtype.block_elems)
        weights = None
        if imatrix is not None:
            weights = imatrix.expand(rows, n_in).reshape(-1, cls.qtype.block_elems)
        return cls.quantize_blocks(blocks, weights).reshape(rows, -1)


def format_for(qtype: GGMLType) -> type[BlockFormat]:
    try:
        return _FORMATS[qtype]
    except KeyError:
        raise ValueError(f"no block format registered for {qtype.name}") from None


def can_quantize(qtype: GGMLType) -> bool:
    fmt = _FORMATS.get(qtype)
    return fmt is not None and fmt.quantize_blocks.__func__ is not BlockFormat.quantize_blocks.__func__


# ---- small helpers shared by the block formats ---------------------------------

def field_of(blocks: torch.Tensor, qtype: GGMLType, name: str) -> torch.Tensor:
    """Field ``name`` of ``qtype``'s blocks ``[n, block_bytes]``, as a view."""
    return blocks[:, qtype.layout.span(name)]


def f16_field(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The little-endian f16 at byte ``offset`` of every block, as float32 ``[n, 1]``."""
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).to(torch.float32)


def f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """float ``[n, 1]`` rounded to f16 and returned as uint8 ``[n, 2]``."""
    return x.to(torch.float16).contiguous().view(torch.uint8).reshape(-1, 2)


def nibbles_into(qs: torch.Tensor, low: torch.Tensor, high: torch.Tensor) -> None:
    """Write the low and high nibbles of uint8 ``qs`` into the views ``low`` and
    ``high`` (of ``qs``'s shape, broadcasting) without temporaries."""
    if torch.compiler.is_compiling():      # dynamo refuses out= into a strided view
        low.copy_(qs & 0x0F)
        high.copy_(qs >> 4)
        return
    torch.bitwise_and(qs, 0x0F, out=low)
    torch.bitwise_right_shift(qs, 4, out=high)


def split_nibbles(qs: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Unpack uint8 ``qs`` ``[..., k]`` into uint8 ``out`` ``[..., 2, k]`` (often a
    view of a bigger buffer): the low nibbles, then the high nibbles."""
    nibbles_into(qs.unsqueeze(-2), out[..., :1, :], out[..., 1:, :])
    return out


def join_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`split_nibbles`: codes ``[..., 2, k]`` (their low 4 bits;
    any dtype that converts to uint8 exactly) to uint8 ``[..., k]``."""
    q = codes.to(torch.uint8) & 0x0F
    return q[..., 0, :] | (q[..., 1, :] << 4)


@functools.lru_cache(maxsize=None)
def _spread_table(device: torch.device) -> torch.Tensor:
    b = torch.arange(256, dtype=torch.int64)
    return sum((((b >> i) & 1) << 4) << (8 * i) for i in range(8)).to(device)


def fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """uint8 ``[..., k]`` to uint8 ``[..., k, 8]``: byte i of entry j is bit i
    of ``qh[..., j]`` moved to bit 4, ready to OR onto a nibble. One table
    gather of an int64 (8 bytes, little-endian host) per input byte, which is
    much faster than shifting a broadcast tensor."""
    spread = _spread_table(qh.device)[qh.reshape(-1).long()]
    return spread.view(torch.uint8).reshape(*qh.shape, 8)
