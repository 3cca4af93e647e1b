"""The GGML type registry: the single source of block geometry.

Every other module (dequantizers, quantizers, the GGUF reader, Metal and
Triton kernels) reads block sizes from here. The byte sums spell out each
block's fields in struct order, so the layout can be checked at a glance.
"""
from __future__ import annotations

import operator
from enum import IntEnum

QK_K = 256          # elements in a K-quant super-block
K_SCALE_SIZE = 12   # packed 6-bit scales + mins of a Q4_K / Q5_K block
QK_LEGACY = 32      # elements in a Q4_0 .. Q8_0 block
QK_NVFP4 = 64       # elements in a llama.cpp NVFP4 block (4 sub-blocks of 16)
NVFP4_GROUP = 16    # inputs sharing one E4M3 scale (both NVFP4 formats)


class GGMLType(IntEnum):
    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    BF16 = 30
    NVFP4 = 40            # llama.cpp: 64-element blocks, 4 UE4M3 scales + 32 nibble bytes
    NVFP4_E2M1 = 1000     # Muser-native payload; scales live in companion tensors
    F8_E4M3FN = 1001      # raw E4M3FN bytes, only for NVFP4 companion scales

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


# (elements per block, bytes per block); the byte sums follow struct order.
_GEOMETRY: dict[GGMLType, tuple[int, int]] = {
    GGMLType.F32: (1, 4),
    GGMLType.F16: (1, 2),
    GGMLType.BF16: (1, 2),
    GGMLType.F8_E4M3FN: (1, 1),
    GGMLType.Q4_0: (QK_LEGACY, 2 + QK_LEGACY // 2),                  # d, qs
    GGMLType.Q4_1: (QK_LEGACY, 2 + 2 + QK_LEGACY // 2),              # d, m, qs
    GGMLType.Q5_0: (QK_LEGACY, 2 + 4 + QK_LEGACY // 2),              # d, qh, qs
    GGMLType.Q5_1: (QK_LEGACY, 2 + 2 + 4 + QK_LEGACY // 2),          # d, m, qh, qs
    GGMLType.Q8_0: (QK_LEGACY, 2 + QK_LEGACY),                       # d, qs
    GGMLType.Q4_K: (QK_K, 2 + 2 + K_SCALE_SIZE + QK_K // 2),          # d, dmin, scales, qs
    GGMLType.Q5_K: (QK_K, 2 + 2 + K_SCALE_SIZE + QK_K // 8 + QK_K // 2),  # d, dmin, scales, qh, qs
    GGMLType.Q6_K: (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),    # ql, qh, scales, d
    GGMLType.NVFP4: (QK_NVFP4, QK_NVFP4 // NVFP4_GROUP + QK_NVFP4 // 2),  # 4 ue4m3, qs
    # One scale group of the native payload: 16 codes in 8 bytes. The group's
    # E4M3 scale is a separate companion tensor, so rows must fill whole groups.
    GGMLType.NVFP4_E2M1: (NVFP4_GROUP, NVFP4_GROUP // 2),
}

# Types whose scales live outside the tensor (companions bound by name).
NEEDS_COMPANIONS = frozenset({GGMLType.NVFP4_E2M1})
