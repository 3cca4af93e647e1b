"""Property tests (hypothesis): inputs that random draws rarely hit -- repeated
values, subnormals, signed zeros, rows of one magnitude, arbitrary block
bytes -- and that hypothesis shrinks to a minimal failing case.

* the native CPU kernel and the torch reference decode any bytes identically;
* quantize stays byte-identical to ggml on adversarial finite rows.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from muser_torch import GGMLType, dequantize, quantize
from muser_torch.formats import dequantize_reference
from muser_torch.ops import cpu

from .ggml_ref import lib, quantize_chunk

SETTINGS = settings(max_examples=int(os.environ.get("MUSER_HYPOTHESIS_EXAMPLES", "60")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
NATIVE = sorted(cpu.NATIVE_TYPES) if cpu.native_available() else []
# every type ggml quantizes that we do (NVFP4_E2M1 is ours alone)
GGML_QUANTIZES = [GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                  GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.F16, GGMLType.BF16,
                  GGMLType.NVFP4, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ4_NL, GGMLType.IQ4_XS,
                  GGMLType.MXFP4]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, except that any NaN matches any NaN (the C and torch
    arithmetic may propagate different payloads)."""
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a.view(torch.int32)[~nan], b.view(torch.int32)[~nan])


@SETTINGS
@given(qtype=st.sampled_from(NATIVE), rows=st.integers(1, 4), blocks=st.integers(1, 3), data=st.data())
def test_native_decodes_any_bytes_like_the_reference(qtype, rows, blocks, data):
    """Whatever the bytes (inf and NaN scales included): the same floats."""
    if not cpu.native_available():
        pytest.skip("no native CPU library on this machine")
    n_in = blocks * max(qtype.block_elems, 16)
    raw = data.draw(hnp.arrays(np.uint8, (rows, qtype.row_bytes(n_in))), label="bytes")
    packed = torch.from_numpy(raw)
    extra = {}
    if qtype == GGMLType.NVFP4_E2M1:
        extra = {"scales": torch.from_numpy(data.draw(hnp.arrays(np.uint8, (rows, n_in // 16)),
                                                      label="scales")),
                 "scale_2": data.draw(st.floats(2.0 ** -20, 1e3, width=32), label="scale_2")}
    with cpu.use_native(True):
        got = dequantize(packed, qtype, n_in, **extra)
    assert _same_bits(got, dequantize_reference(packed, qtype, n_in, **extra))


def _rows(n_in: int):
    """Finite float32 rows mixing magnitudes from 2^-60 to 1e4, with repeats
    (hypothesis favours them) and zeros of both signs. Not below: where a
    block's range is under ~15 * 2^-128, ggml's 1/d overflows to inf and its
    ``(int8_t)(inf)`` is undefined behaviour in C (x86 happens to give 0)."""
    magnitude = st.floats(2.0 ** -60, 1e4, width=32)
    element = st.one_of(magnitude, magnitude.map(lambda v: -v), st.sampled_from([0.0, -0.0, 1.0, -1.0]))
    return hnp.arrays(np.float32, st.tuples(st.integers(1, 3), st.just(n_in)), elements=element)


@SETTINGS
@given(qtype=st.sampled_from(GGML_QUANTIZES), weighted=st.booleans(), data=st.data())
def test_quantize_is_byte_identical_to_ggml_on_adversarial_rows(qtype, weighted, data):
    """With and without an importance matrix (zeros in it included)."""
    lib()
    unit = 256 if qtype.block_elems == 256 else 64
    x = torch.from_numpy(data.draw(_rows(unit), label="x"))
    imatrix = None
    if weighted:
        weight = st.one_of(st.just(0.0), st.floats(2.0 ** -20, 1e4, width=32))
        imatrix = torch.from_numpy(data.draw(hnp.arrays(np.float32, unit, elements=weight), label="imatrix"))
    ours, ref = quantize(x, qtype, imatrix=imatrix), quantize_chunk(x, qtype, imatrix)
    assert torch.equal(ours, ref), f"{qtype.name}: ours {ours.tolist()} ggml {ref.tolist()}"
