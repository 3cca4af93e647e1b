"""The GGML type registry. Block geometry comes from the field declarations
in ``layout.py``; every other module (dequantizers, quantizers, the GGUF
reader, the C, Metal and Triton kernels) reads it from there.
"""
from __future__ import annotations

import operator
from enum import IntEnum

from .layout import (K_SCALE_SIZE, LAYOUTS, NVFP4_GROUP, QK_IQ4_NL, QK_K, QK_LEGACY, QK_MXFP4,  # noqa: F401
                     QK_NVFP4, Layout)  # noqa: F401


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    IQ3_XXS = 18          # 256 elements: f16 scale, 64 grid indices, 8 u32 of 4-bit scale + 28 sign bits
    IQ4_NL = 20           # 32 elements: f16 scale + 16 bytes of indices into a 16-value table
    IQ3_S = 21            # 256 elements: f16 scale, 9-bit grid indices, 256 sign bits, 4-bit scales
    IQ4_XS = 23           # 256 elements: f16 scale, 6-bit sub-block scales, IQ4_NL's table
    BF16 = 30
    MXFP4 = 39            # 32 elements: E8M0 scale + 16 bytes of E2M1 codes
    NVFP4 = 40            # llama.cpp: 64-element blocks, 4 UE4M3 scales + 32 nibble bytes
    NVFP4_E2M1 = 1000     # Muser-native payload; scales live in companion tensors
    F8_E4M3FN = 1001      # raw E4M3FN bytes, only for NVFP4 companion scales

    @property
    def layout(self) -> Layout:
        """The block's fields in struct order (``formats/layout.py``)."""
        return LAYOUTS[self.name]

    @property
    def block_elems(self) -> int:
        return _GEOMETRY[self][0]

    @property
    def block_bytes(self) -> int:
        return _GEOMETRY[self][1]

    @property
    def bits_per_weight(self) -> float:
        """Bits per element of this tensor's own bytes (NVFP4_E2M1: payload only;
        its E4M3 companion adds 8/16 = 0.5 bit for 4.5 in all)."""
        return self.block_bytes * 8 / self.block_elems

    def row_bytes(self, n_in: int) -> int:
        """Bytes of one row of ``n_in`` elements; ``n_in`` must fill whole blocks."""
        if n_in <= 0 or n_in % self.block_elems:
            raise ValueError(
                f"{self.name}: n_in={n_in} is not a positive multiple of the "
                f"block size {self.block_elems}")
        return n_in // self.block_elems * self.block_bytes

    @classmethod
    def parse(cls, qtype: "int | str | GGMLType") -> "GGMLType":
        """Accept a GGMLType, its integer id or its name; raise ValueError otherwise."""
        if isinstance(qtype, GGMLType):
            return qtype
        if isinstance(qtype, str):
            try:
                return cls[qtype.upper()]
            except KeyError:
                raise ValueError(f"unknown GGML type name {qtype!r}") from None
        try:
            if isinstance(qtype, bool):   # an int subclass, but never a type id
                raise TypeError
            return cls(operator.index(qtype))   # ints only: 12.7 is not Q4_K
        except (ValueError, TypeError):
            raise ValueError(f"unknown GGML type id {qtype!r}") from None


# (elements per block, bytes per block), derived from the field declarations.
_GEOMETRY: dict[GGMLType, tuple[int, int]] = {
    t: (LAYOUTS[t.name].block_elems, LAYOUTS[t.name].block_bytes) for t in GGMLType}

# Types whose scales live outside the tensor (companions bound by name).
NEEDS_COMPANIONS = frozenset(t for t in GGMLType if LAYOUTS[t.name].companions)
