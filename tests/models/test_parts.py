"""The shared RoPE variants against a float64 complex rotation: NeoX pairs
feature i with i + D/2, llama.cpp's "normal" pairs 2i with 2i + 1; linear
scaling divides the positions."""
from __future__ import annotations

import pytest
import torch

from muser_torch.models.parts import rope_angles, rope_inv_freq, rope_neox, rope_normal

from .conftest import SEED
from ..bounds import check_bound


def _reference(x: torch.Tensor, pos: torch.Tensor, base: float, scale: float, interleaved: bool):
    D = x.shape[-1]
    freq = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
    angle = pos.double()[..., None] / scale * freq                    # [B, T, D/2]
    rot = torch.polar(torch.ones_like(angle), angle)[:, :, None]        # [B, T, 1, D/2]
    xd = x.double()
    pairs = torch.complex(xd[..., 0::2], xd[..., 1::2]) if interleaved else \
        torch.complex(xd[..., :D // 2], xd[..., D // 2:])
    out = pairs * rot
    if interleaved:
        return torch.stack((out.real, out.imag), -1).flatten(-2)
    return torch.cat((out.real, out.imag), -1)


@pytest.mark.parametrize("rope,interleaved", [(rope_neox, False), (rope_normal, True)])
@pytest.mark.parametrize("scale", [1.0, 8.0])
def test_rope_rotates_its_pairs(rope, interleaved, scale):
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(2, 7, 3, 64, generator=g)
    pos = torch.randint(0, 5000, (2, 7), generator=g)
    got = rope(x, *rope_angles(pos, rope_inv_freq(64, 10000.0, scale)))
    want = _reference(x, pos, 10000.0, scale, interleaved)
    err = float((got.double() - want).abs().max())
    check_bound("rope: max error to float64", err, 2e-3, f"{rope.__name__} scale {scale}: max error {err:.2e} (seed {SEED})")
    # float32 angles at positions ~5000: the error is the angle's rounding, not the pairing
    other = _reference(x, pos, 10000.0, scale, not interleaved)
    assert float((got.double() - other).abs().max()) > 0.5, "the pairing makes no difference"
