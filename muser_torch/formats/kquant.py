"""The K-quant super-blocks: Q4_K, Q5_K, Q6_K (256 elements each).

Q4_K, 144 bytes                       Q5_K, 176 bytes
  0x00  2  d     f16 super-scale        0x00  2  d
  0x02  2  dmin  f16 super-min          0x02  2  dmin
  0x04 12  scales (8 x 6-bit sc, m)     0x04 12  scales
  0x10 128 qs    256 nibbles            0x10 32  qh  fifth bit of each element
                                        0x30 128 qs
  y = d*sc_j * q - dmin*m_j, sub-block j = 32 elements.
  In each 64-element group g, qs[32g + l] holds element 64g + l (low nibble,
  sub-block 2g) and element 64g + 32 + l (high nibble, sub-block 2g + 1);
  Q5_K's bit j of qh[l] is the fifth bit of element 32j + l.

The 6-bit scale strip (Chapter 6, Figure 6.3), one row per byte:

  byte      b7 b6 | b5 .. b0
  0..3      sc4..7 hi2 | sc0..3
  4..7      m4..7  hi2 | m0..3
  8..11     m4..7 lo4 (b7..b4) | sc4..7 lo4 (b3..b0)

Q6_K, 210 bytes: ql[128] (low 4 bits), qh[64] (high 2 bits), int8 sc[16]
(sub-blocks of 16), d f16 last. Per 128-element half h and l in 0..31:
  q[l]      = ql[64h + l]      & 0xF | ((qh[32h + l] >> 0) & 3) << 4
  q[l + 32] = ql[64h + l + 32] & 0xF | ((qh[32h + l] >> 2) & 3) << 4
  q[l + 64] = ql[64h + l]      >> 4  | ((qh[32h + l] >> 4) & 3) << 4
  q[l + 96] = ql[64h + l + 32] >> 4  | ((qh[32h + l] >> 6) & 3) << 4
  y = d * sc_j * (q - 32).

Dequantization multiplies in gguf/ggml's order, ``(d*sc)*q - (dmin*m)``, in
float32, so results are bit-identical to both.
"""
from __future__ import annotations

import torch

from .registry import BlockFormat, bits, f16_field, nibbles
from .types import K_SCALE_SIZE, QK_K, GGMLType


def unpack_scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 ``[n, 12]`` to the 6-bit (sc, m) of the 8 sub-blocks, each ``[n, 8]``."""
    lo_sc, lo_m, mixed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat((lo_sc & 0x3F, (mixed & 0x0F) | ((lo_sc >> 2) & 0x30)), dim=1)
    m = torch.cat((lo_m & 0x3F, (mixed >> 4) | ((lo_m >> 2) & 0x30)), dim=1)
    return sc, m


def pack_scale_min_k4(sc: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`unpack_scale_min_k4`: 6-bit ``[n, 8]`` pairs to uint8 ``[n, 12]``."""
    sc, m = sc.to(torch.uint8), m.to(torch.uint8)
    lo_sc = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    lo_m = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    mixed = (sc[:, 4:] & 0x0F) | ((m[:, 4:] & 0x0F) << 4)
    return torch.cat((lo_sc, lo_m, mixed), dim=1)


def _asymmetric(blocks: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Shared tail of Q4_K and Q5_K: codes ``[n, 8, 32]`` to float32 ``[n, 256]``."""
    n = blocks.shape[0]
    d, dmin = f16_field(blocks, 0), f16_field(blocks, 2)
    sc, m = unpack_scale_min_k4(blocks[:, 4:4 + K_SCALE_SIZE])
    scale = (d * sc.to(torch.float32)).unsqueeze(-1)
    shift = (dmin * m.to(torch.float32)).unsqueeze(-1)
    return (scale * q.to(torch.float32) - shift).reshape(n, QK_K)


class Q4_K(BlockFormat, qtype=GGMLType.Q4_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        qs = blocks[:, 16:].reshape(-1, 4, 32)
        return _asymmetric(blocks, nibbles(qs).reshape(-1, 8, 32))


class Q5_K(BlockFormat, qtype=GGMLType.Q5_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        qh = bits(blocks[:, 16:48], 8)                     # [n, 8, 32]
        qs = nibbles(blocks[:, 48:].reshape(-1, 4, 32)).reshape(-1, 8, 32)
        return _asymmetric(blocks, qs | (qh << 4))


def q6_k_codes(blocks: torch.Tensor) -> torch.Tensor:
    """The unsigned 6-bit codes of Q6_K blocks, uint8 ``[n, 256]`` in element order."""
    n = blocks.shape[0]
    ql = nibbles(blocks[:, :128].reshape(n, 2, 2, 32))     # [n, half, part, nib, 32]
    # (low, part 0), (low, part 1), (high, part 0), (high, part 1) = l, l+32, l+64, l+96
    ql = ql.transpose(2, 3).reshape(n, 2, 4, 32)
    qh = bits(blocks[:, 128:192].reshape(n, 2, 32), 4, 2)  # [n, half, 4, 32]
    return (ql | (qh << 4)).reshape(n, QK_K)


class Q6_K(BlockFormat, qtype=GGMLType.Q6_K):
    @classmethod
    def dequantize_blocks(cls, blocks):
        n = blocks.shape[0]
        d = f16_field(blocks, 208)
        sc = blocks[:, 192:208].contiguous().view(torch.int8).to(torch.float32)
        q = (q6_k_codes(blocks).to(torch.int8) - 32).to(torch.float32)
        return ((d * sc).unsqueeze(-1) * q.reshape(n, 16, 16)).reshape(n, QK_K)
