"""IQ3_XXS and IQ3_S: our grid data against gguf-py's, and the reference
decoder bit-exact with gguf-py's numpy dequantize on bytes ggml's own
quantizer wrote (random bytes: ``test_dequantize.py``)."""
from __future__ import annotations

import random

import gguf
import numpy as np
import pytest
import torch
from gguf import quants

from muser_torch.formats import GGMLType, dequantize_reference
from muser_torch.formats.iq3 import grid_values
from muser_torch.formats.iq_grids import KSIGNS

from .ggml_ref import quantize_chunk

IQ3 = [GGMLType.IQ3_XXS, GGMLType.IQ3_S]


@pytest.mark.parametrize("qtype", IQ3, ids=lambda t: t.name)
def test_grid_is_gguf_pys(qtype: GGMLType) -> None:
    fmt = getattr(quants, qtype.name)
    fmt.init_grid()
    theirs = torch.from_numpy(fmt.grid.reshape(fmt.grid_shape).copy())
    assert torch.equal(grid_values(qtype, torch.device("cpu")), theirs)


def test_ksigns_are_gguf_pys() -> None:
    assert bytes(KSIGNS) == quants.IQ2_XXS.ksigns


@pytest.mark.parametrize("weighted", [False, True], ids=["ref", "imatrix"])
@pytest.mark.parametrize("qtype", IQ3, ids=lambda t: t.name)
def test_ggml_quantized_bytes_decode_as_gguf_py(qtype: GGMLType, weighted: bool) -> None:
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    n_in = 256 * int(torch.randint(1, 4, (1,), generator=g))
    x = torch.randn(64, n_in, generator=g) * torch.rand(64, 1, generator=g) * 4
    imatrix = torch.rand(n_in, generator=g) + 0.05 if weighted else None
    packed = quantize_chunk(x, int(qtype), imatrix)
    ref = gguf.dequantize(packed.numpy(), gguf.GGMLQuantizationType(int(qtype))).reshape(64, n_in)
    ours = dequantize_reference(packed, qtype, n_in).numpy()
    bad = np.flatnonzero((ours.view(np.uint32) != ref.view(np.uint32)).any(-1))
    assert bad.size == 0, f"{qtype.name} seed {seed}: rows {bad[:8].tolist()} differ from gguf-py"
    # the bytes are a quantization of x, not noise: the grid and scales were read right
    assert float((torch.from_numpy(ours) - x).pow(2).mean().sqrt()) < 0.3 * float(x.std())
