"""Every Metal kernel, run through the CPU emulator under all three lane
schedules, against the CPU reference (muser_torch.dequantize, bit-exact with
gguf, then a float64 matmul)."""
from __future__ import annotations

import pytest
import torch

from muser_torch import GGMLType
from muser_torch import ops
from muser_torch_metal_emulator import emulator
from muser_torch.ops import metal

from ...bounds import check_bound, check_floor
from .helpers import (IDS, SHAPE_OF, SHAPES, TOKEN_COUNTS, fresh_seed, random_weights, reference, rel_err,
                      swap_first_two_blocks)

pytestmark = pytest.mark.usefixtures("emulate")


def test_the_tests_cover_every_supported_type():
    assert {t for t, _, _ in SHAPES} == metal.SUPPORTED == set(SHAPE_OF)


def test_every_type_and_rung_has_its_kernel():
    lib = metal._compile(metal.source(), emulate=True)
    names = set(dir(lib))
    for qt in metal.SUPPORTED:
        for kind in metal.KERNEL_KINDS:
            assert metal.kernel_name(qt, kind) in names, (qt, kind)
    assert len(names) == len(metal.SUPPORTED) * len(metal.KERNEL_KINDS)


def test_ladder():
    assert [metal.rung_for(GGMLType.Q4_K, n).name for n in TOKEN_COUNTS] == \
        ["mv", "ext", "ext", "ext", "ext", "ext", "mm", "mm", "mm", "mm"]
    assert [r.name for r in metal.LADDER] == ["mv", "ext", "mm"]


def test_the_source_is_ascii_and_plain_msl():
    """PyTorch hands the source to Metal as ASCII; the prelude carries the layout
    table's offsets; nothing emulator-specific is left in the kernels."""
    src = metal.source()
    assert src.isascii()
    from muser_torch.formats.layout import c_header
    assert c_header("MUSER_").rstrip() in src
    assert "MUSER_TG_ARRAY" not in src and "emu_" not in src


@pytest.mark.parametrize("qtype,n_out,n_in", SHAPES, ids=IDS)
def test_qmatmul_every_rung(qtype, n_out, n_in, lane_schedule):
    seed = fresh_seed()
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed)
    w = reference(packed, qtype, n_in, scales, scale_2).double()
    g = torch.Generator().manual_seed(seed + 1)
    for n_tok in TOKEN_COUNTS:
        x = torch.randn(n_tok, n_in, generator=g)
        y = metal.qmatmul(x, packed, int(qtype), n_out, n_in, scales, scale_2)
        ref = x.double() @ w.T
        assert y.shape == (n_tok, n_out) and y.dtype == torch.float32
        check_bound("rel err to float64", rel_err(y, ref), 1e-5,
                    f"{qtype.name} rung {metal.rung_for(qtype, n_tok).name} n_tok={n_tok} schedule="
                    f"{lane_schedule} (seed {seed})")


@pytest.mark.parametrize("qtype,n_out,n_in", SHAPES, ids=IDS)
def test_dequantize_is_bit_exact(qtype, n_out, n_in, lane_schedule):
    seed = fresh_seed()
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed)
    got = metal.dequantize(packed, int(qtype), n_out, n_in, scales, scale_2)
    want = reference(packed, qtype, n_in, scales, scale_2)
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (f"{qtype.name}: {len(bad)} elements differ, first at {bad[0].tolist()} "
                              f"(seed {seed}, schedule {lane_schedule})")


@pytest.mark.parametrize("qtype,n_out,n_in", SHAPES, ids=IDS)
def test_embedding_reads_requested_rows(qtype, n_out, n_in, lane_schedule):
    seed = fresh_seed()
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed)
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, n_out, (2, 5), generator=g)
    ids[0, 0] = n_out - 1                                     # the last row: its end touches the guard page
    got = metal.embedding(ids, packed, int(qtype), n_out, n_in, scales, scale_2)
    want = reference(packed, qtype, n_in, scales, scale_2)[ids]
    assert got.shape == (2, 5, n_in)
    assert torch.equal(got, want), f"{qtype.name}: embedding rows differ (seed {seed}, schedule {lane_schedule})"


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.NVFP4_E2M1, GGMLType.Q5_1], ids=lambda t: t.name)
def test_ext_rung_pins_matvec_order(qtype):
    """The 2..8-token rung reduces each token exactly as the 1-token rung does
    (same chunk order, same simd_sum tree), so its rows are bit-identical."""
    n_out, n_in = SHAPE_OF[qtype]
    seed = fresh_seed()
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed)
    x = torch.randn(5, n_in, generator=torch.Generator().manual_seed(seed))
    batch = metal.qmatmul(x, packed, int(qtype), n_out, n_in, scales, scale_2)
    for t in range(5):
        one = metal.qmatmul(x[t:t + 1], packed, int(qtype), n_out, n_in, scales, scale_2)
        assert torch.equal(batch[t], one[0]), f"token {t} (seed {seed})"


@pytest.mark.parametrize("qtype", [GGMLType.Q4_K, GGMLType.Q8_0], ids=lambda t: t.name)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_qmatmul_keeps_activation_dtype_and_leading_dims(dtype, qtype):
    seed = fresh_seed()
    n_out, n_in = SHAPE_OF[qtype]
    packed, scales, scale_2 = random_weights(qtype, n_out, n_in, seed)
    x = torch.randn(2, 3, n_in, generator=torch.Generator().manual_seed(seed)).to(dtype)
    y = metal.qmatmul(x, packed, int(qtype), n_out, n_in)
    ref = x.double() @ reference(packed, qtype, n_in, None, None).double().T
    assert y.dtype == dtype and y.shape == (2, 3, n_out)
    check_bound("rel err to float64 (half activations)", rel_err(y, ref), 1e-2, f"(seed {seed})")


def test_emulator_catches_a_missing_barrier_in_the_tiled_matmul(lane_schedule):
    """Delete the barrier between filling the tiles and multiplying them: the
    emulated mm kernel must then go wrong under every schedule."""
    barrier = "    threadgroup_barrier(mem_flags::mem_threadgroup);\n    for (int kk"
    src, cut = metal.source(), '#line 1 "legacy.metal"'
    assert barrier in src and cut in src
    src = src.split(cut)[0]          # the prelude, the shared loops and the K-quants: enough for muser_mm_q4_k
    lib = emulator.compile_shader(src.replace(barrier, "    for (int kk"))
    seed = fresh_seed()
    qtype = GGMLType.Q4_K
    n_out, n_in = SHAPE_OF[qtype]
    packed, _, _ = random_weights(qtype, n_out, n_in, seed)
    x = torch.randn(17, n_in, generator=torch.Generator().manual_seed(seed))
    y = torch.zeros(17, n_out)
    lib.muser_mm_q4_k(packed, packed, torch.ones(1), x, y, n_out, n_in, 17,
                      threads=(metal.MM_THREADS, 2), group_size=(metal.MM_THREADS, 1))
    ref = x.double() @ reference(packed, qtype, n_in, None, None).double().T
    # the twin of test_qmatmul_every_rung's bound
    check_floor("missing barrier: rel err to float64", rel_err(y, ref), 1e-5,
                f"went unnoticed ({lane_schedule}, seed {seed})")


def test_rows_outside_the_fence_raise():
    """Rows the chunk decoders cannot cover (types without a Metal kernel are
    refused at the op boundary: test_ops_emulated.py)."""
    with pytest.raises(ValueError, match=r"multiple of 16"):
        metal.dequantize(torch.zeros(2, 20, dtype=torch.uint8), int(GGMLType.F16), 2, 10)


def test_fast_math_is_refused(monkeypatch):
    monkeypatch.setenv("PYTORCH_MPS_FAST_MATH", "1")
    with pytest.raises(RuntimeError, match="PYTORCH_MPS_FAST_MATH is set; the Metal kernels need safe math"):
        metal._compile(metal.source(), emulate=True)


def test_gpu_limits_are_checked_on_first_use():
    class Narrow:
        thread_execution_width, max_threads_per_threadgroup = 16, 1024

    class Small:
        thread_execution_width, max_threads_per_threadgroup = 32, 96

    with pytest.raises(RuntimeError, match="16-wide simdgroups; the Metal kernels assume 32"):
        metal._check_limits(Narrow(), "muser_mv_q4_k", "mv")
    metal._check_limits(Small(), "muser_mv_q4_k", "mv")
    with pytest.raises(RuntimeError, match="allows 96 threads per threadgroup; it is launched with 128"):
        metal._check_limits(Small(), "muser_mm_q4_k", "mm")


def test_cpu_tensors_need_emulate_mode():
    qtype = GGMLType.Q4_K
    n_out, n_in = SHAPE_OF[qtype]
    packed, _, _ = random_weights(qtype, n_out, n_in, 0)
    with ops.use_backend("native"), \
            pytest.raises(ValueError, match=r"use_backend\('metal-emulator'\)"):
        metal.dequantize(packed, int(qtype), n_out, n_in)


GGML_QUANTIZED = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.IQ3_XXS, GGMLType.IQ3_S]


@pytest.mark.parametrize("qtype", GGML_QUANTIZED, ids=lambda t: t.name)
def test_ggml_quantized_bytes_against_ggml(qtype):
    """Weights written by ggml's own quantizer, every rung: within 1e-5 of
    float64 on gguf-py's dequantization; and ggml's CPU mul_mat on the same
    bytes within 1e-5 of float64 on the same weights and on x as ggml rounds
    it (Q8_K). Until issue 41 ggml's output was compared with ours (NMSE
    under 5e-4): the rounding of x, a heavy-tailed noise (test_lookup.py)."""
    import gguf

    from ...formats.ggml_ref import quantize_chunk
    from ..ggml_matmul import ggml_activations, ggml_mul_mat
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    n_out, n_in = 13, 512
    packed = quantize_chunk(torch.randn(n_out, n_in, generator=g) * torch.rand(n_out, 1, generator=g), qtype)
    w = torch.from_numpy(gguf.dequantize(packed.numpy(), gguf.GGMLQuantizationType(int(qtype)))).double()
    w = w.reshape(n_out, n_in)
    bad = swap_first_two_blocks(packed, n_in // qtype.block_elems)
    for n_tok in (1, 5, 17):
        x = torch.randn(n_tok, n_in, generator=g)
        where = f"{qtype.name} n_tok={n_tok} (seed {seed})"
        y = metal.qmatmul(x, packed, int(qtype), n_out, n_in, None, None)
        check_bound("ours: rel err to float64", rel_err(y, x.double() @ w.T), 1e-5, where)
        xq = ggml_activations(int(qtype), x)
        ref = ggml_mul_mat(packed, int(qtype), n_out, n_in, x)
        check_bound("ggml: rel err to float64 on its rounded x", rel_err(ref, xq @ w.T), 1e-5, where)
        # The planted-defect twin: each row's first two blocks swapped break both bounds.
        y = metal.qmatmul(x, bad, int(qtype), n_out, n_in, None, None)
        check_floor("ours on swapped blocks: rel err to float64", rel_err(y, x.double() @ w.T), 1e-5, where)
        ref = ggml_mul_mat(bad, int(qtype), n_out, n_in, x)
        check_floor("ggml on swapped blocks: rel err to float64", rel_err(ref, xq @ w.T), 1e-5, where)
