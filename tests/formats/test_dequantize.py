"""dequantize: bit-exact against gguf's numpy dequantize, the worked
Q4_K block of docs/muse-glimmer.md, and clear errors for bad input.

``dequantize`` is the op ``muser.dequantize`` (the native kernel on CPU, the
device's backend elsewhere, which refuses by name a type it has no kernel
for) and ``dequantize_reference`` (vectorized torch) runs everywhere; both
are held to gguf."""
from __future__ import annotations

import random

import gguf
import numpy as np
import pytest
import torch

from muser_torch import GGMLType, dequantize
from muser_torch.formats import dequantize_reference
from muser_torch import ops
from muser_torch.formats.kquant import pack_scale_min_k4, unpack_scale_min_k4
from muser_torch.ops import cpu

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else []) + (
    ["mps"] if torch.backends.mps.is_available() else [])

# Every type of ours that gguf can dequantize (F8_E4M3FN and NVFP4_E2M1 are
# Muser-native; they are checked against torch's float8 below).
GGUF_TYPES = [t for t in GGMLType if t.name in gguf.GGMLQuantizationType.__members__
              and int(gguf.GGMLQuantizationType[t.name]) == int(t)]

# Byte offsets of the f16 fields in each block, which get extreme finite values.
F16_FIELDS = {
    GGMLType.Q4_0: (0,), GGMLType.Q4_1: (0, 2), GGMLType.Q5_0: (0,), GGMLType.Q5_1: (0, 2),
    GGMLType.Q8_0: (0,), GGMLType.Q4_K: (0, 2), GGMLType.Q5_K: (0, 2), GGMLType.Q6_K: (208,),
    GGMLType.Q2_K: (80, 82), GGMLType.Q3_K: (108,),
    GGMLType.IQ4_NL: (0,), GGMLType.IQ4_XS: (0,), GGMLType.IQ3_XXS: (0,), GGMLType.IQ3_S: (0,),
}
# Byte offsets of E8M0 scales: every byte whose largest value, 12 * 2**(e - 128), is finite.
E8M0_FIELDS = {GGMLType.MXFP4: (0,)}
E8M0_FINITE = 253


def finite_f16_bits(rng: np.random.Generator, n: int) -> np.ndarray:
    """Random f16 bit patterns over the whole finite range: subnormals to 65504, both signs."""
    u = rng.integers(0, 1 << 16, size=n, dtype=np.uint16)
    inf_nan = (u & 0x7C00) == 0x7C00
    u[inf_nan] &= np.uint16(0xFBFF)           # clear one exponent bit: now finite
    return u


def random_packed(qtype: GGMLType, rows: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """Random blocks whose float fields are finite but span extreme magnitudes."""
    raw = rng.integers(0, 256, size=(rows * n_in // qtype.block_elems, qtype.block_bytes), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, ()):
        raw[:, off:off + 2] = finite_f16_bits(rng, raw.shape[0]).view(np.uint8).reshape(-1, 2)
    for off in E8M0_FIELDS.get(qtype, ()):
        raw[:, off] = rng.integers(0, E8M0_FINITE, size=raw.shape[0], dtype=np.uint8)
    if qtype in (GGMLType.F16,):
        raw = finite_f16_bits(rng, raw.size // 2).view(np.uint8).reshape(raw.shape[0], -1)
    elif qtype == GGMLType.F32:
        raw = rng.standard_normal(raw.size // 4).astype(np.float32)
        raw *= np.float32(10.0) ** rng.integers(-30, 30, size=raw.size).astype(np.float32)
        raw = raw.view(np.uint8).reshape(-1, 4)
    elif qtype == GGMLType.BF16:
        bits = rng.integers(0, 1 << 16, size=raw.size // 2, dtype=np.uint16)
        bits[(bits & 0x7F80) == 0x7F80] &= np.uint16(0xFF7F)
        raw = bits.view(np.uint8).reshape(-1, 2)
    return raw.reshape(rows, -1)


IMPLS = {"dequantize": dequantize, "reference": dequantize_reference}


def refused_on(device: str, qtype: GGMLType) -> bool:
    """Whether the op boundary refuses ``qtype`` on ``device``: the CPU
    computes every type, an accelerator's backend the types of its one set."""
    return device != "cpu" and qtype not in ops.backend(device).SUPPORTED


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda t: t.name)
def test_bit_exact_against_gguf(qtype: GGMLType, device: str, impl: str) -> None:
    seed = random.randrange(1 << 32)
    rng = np.random.default_rng(seed)
    n_in = qtype.block_elems * int(rng.integers(1, 5)) * (256 // min(qtype.block_elems, 256))
    rows = int(rng.integers(50, 300))
    raw = random_packed(qtype, rows, n_in, rng)
    ref = gguf.dequantize(raw, gguf.GGMLQuantizationType(int(qtype))).reshape(rows, n_in)
    if impl == "dequantize" and refused_on(device, qtype):
        with pytest.raises(ValueError, match=f"muser.dequantize: {qtype.name} has no .* kernel"):
            dequantize(torch.from_numpy(raw).to(device), qtype, n_in)
        return
    out = IMPLS[impl](torch.from_numpy(raw).to(device), qtype, n_in).cpu().numpy()
    assert out.dtype == np.float32 and out.shape == (rows, n_in)
    assert np.isfinite(ref).all(), f"seed {seed}: the reference itself is not finite"
    same = ref.view(np.uint32) == out.view(np.uint32)
    if not same.all():
        r, c = np.argwhere(~same)[0]
        block = c // qtype.block_elems
        pytest.fail(f"{qtype.name} seed {seed}: {(~same).sum()} elements differ; first at row {r} "
                    f"col {c} (block {block}): got {out[r, c]!r}, gguf {ref[r, c]!r}")


@pytest.mark.parametrize("native", [True, False], ids=["native", "torch"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda t: t.name)
def test_out_is_filled_bit_exactly(qtype: GGMLType, device: str, native: bool) -> None:
    """``out=`` is written in place and returned, whatever it held before
    (NaN here, so an element left unwritten shows); on CPU also without the
    native library (``MUSER_CPU_NATIVE=0``, or no compiler)."""
    if not native and device != "cpu":
        pytest.skip("the native library is a CPU matter")
    if refused_on(device, qtype):
        pytest.skip(f"{qtype.name} is refused on {device} (test_bit_exact_against_gguf)")
    seed = random.randrange(1 << 32)
    rng = np.random.default_rng(seed)
    rows, n_in = int(rng.integers(3, 90)), 512
    raw = random_packed(qtype, rows, n_in, rng)
    ref = gguf.dequantize(raw, gguf.GGMLQuantizationType(int(qtype))).reshape(rows, n_in)
    out = torch.full((rows, n_in), float("nan"), device=device)
    with cpu.use_native(native):
        got = dequantize(torch.from_numpy(raw).to(device), qtype, n_in, out=out)
    assert got is out
    assert np.array_equal(out.cpu().numpy().view(np.uint32), ref.view(np.uint32)), f"seed {seed}"


def test_cpu_tensors_take_the_native_kernel(monkeypatch) -> None:
    """No silent fallback: on CPU ``dequantize`` goes through ops/cpu, in a
    fresh interpreter too (where nothing else imported the ops first)."""
    import subprocess
    import sys

    calls = []
    real = cpu.dequantize_rows
    monkeypatch.setattr(cpu, "dequantize_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    packed = torch.from_numpy(random_packed(GGMLType.Q4_K, 3, 256, np.random.default_rng()))
    dequantize(packed, GGMLType.Q4_K, 256)
    assert calls, "dequantize did not call the CPU kernel module"
    code = ("import torch, muser_torch as m; p = torch.randint(0, 256, (2, 144), dtype=torch.uint8); "
            "print(m.dequantize(p, 'Q4_K', 256).shape)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "[2, 256]" in run.stdout, run.stderr[-2000:]


def test_out_for_companion_type() -> None:
    payload = torch.randint(0, 256, (5, 32), dtype=torch.uint8)
    scales = torch.randint(0, 0x7F, (5, 4), dtype=torch.uint8)
    ref = dequantize_reference(payload, GGMLType.NVFP4_E2M1, 64, scales=scales, scale_2=0.37)
    out = torch.full((5, 64), float("nan"))
    dequantize(payload, GGMLType.NVFP4_E2M1, 64, scales=scales, scale_2=0.37, out=out)
    assert torch.equal(out, ref) and bool(ref.abs().sum() > 0)


def test_dequantize_is_the_op() -> None:
    """``muser_torch.dequantize`` calls ``muser.dequantize`` (the dispatcher
    picks the kernel), with and without ``out=``, and so runs on the meta
    device through the op's fake kernel."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))

    rows, n_in = int(np.random.default_rng().integers(1, 9)), 512
    packed = torch.from_numpy(random_packed(GGMLType.Q4_K, rows, n_in, np.random.default_rng()))
    for out in (None, torch.full((rows, n_in), float("nan"))):
        with Ops() as mode:
            got = dequantize(packed, GGMLType.Q4_K, n_in, out=out)
        assert "muser.dequantize.default" in mode.seen, mode.seen
        assert torch.equal(got, dequantize_reference(packed, GGMLType.Q4_K, n_in))
    meta = dequantize(packed.to("meta"), GGMLType.Q4_K, n_in)
    assert meta.is_meta and meta.shape == (rows, n_in) and meta.dtype == torch.float32


@pytest.mark.parametrize("qtype", GGUF_TYPES, ids=lambda t: t.name)
def test_dequantize_compiles_in_one_graph(qtype: GGMLType) -> None:
    """Under torch.compile the op is one node of the graph (no graph break);
    Q4_K also goes through inductor's generated code."""
    torch._dynamo.reset()
    rng = np.random.default_rng()
    n_in = max(qtype.block_elems, 256)
    packed = torch.from_numpy(random_packed(qtype, 7, n_in, rng))
    backend = "inductor" if qtype == GGMLType.Q4_K else "eager"
    fn = torch.compile(lambda p: dequantize(p, qtype, n_in), fullgraph=True, backend=backend)
    ref = gguf.dequantize(packed.numpy(), gguf.GGMLQuantizationType(int(qtype))).reshape(7, n_in)
    assert np.array_equal(fn(packed).numpy().view(np.uint32), ref.view(np.uint32))


def test_e4m3fn_bytes_against_torch_float8() -> None:
    raw = torch.randint(0, 256, (37, 64), dtype=torch.uint8)
    out = dequantize(raw, GGMLType.F8_E4M3FN, 64)
    ref = raw.view(torch.float8_e4m3fn).to(torch.float32)
    assert torch.equal(out.isnan(), ref.isnan())
    assert torch.equal(out.nan_to_num(0.0), ref.nan_to_num(0.0))


def test_nvfp4_e2m1_against_float64_formula() -> None:
    """The Muser-native lane: w = e2m1(code) * e4m3fn(scale) * scale_2, element 2i low nibble."""
    seed = random.randrange(1 << 32)
    g = torch.Generator().manual_seed(seed)
    rows, n_in = 23, 96
    payload = torch.randint(0, 256, (rows, n_in // 2), dtype=torch.uint8, generator=g)
    scale_bytes = torch.randint(0, 0x7F, (rows, n_in // 16), dtype=torch.uint8, generator=g)  # finite, >= 0
    scale_2 = torch.rand((), generator=g, dtype=torch.float32) * 4 + 0.01
    e2m1 = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    codes = torch.stack((payload & 15, payload >> 4), dim=-1).reshape(rows, n_in).to(torch.int64)
    mag = torch.tensor(e2m1, dtype=torch.float64)[codes & 7]
    value = torch.where(codes >= 8, -mag, mag)
    scale = scale_bytes.view(torch.float8_e4m3fn).to(torch.float64).repeat_interleave(16, dim=1)
    ref = value * scale * scale_2.double()
    out = dequantize(payload, GGMLType.NVFP4_E2M1, n_in, scales=scale_bytes, scale_2=scale_2)
    assert torch.allclose(out.double(), ref, rtol=1e-7, atol=0), f"seed {seed}"


def worked_q4_k_block() -> bytes:
    """The hand-built super-block of docs/muse-glimmer.md ("A worked Q4_K block")."""
    block = bytearray(144)
    block[0:2] = bytes([0x00, 0x28])                 # d = 2^-5
    block[2:4] = bytes([0x00, 0x20])                 # dmin = 2^-7
    block[4:16] = bytes([0x94, 0x4C, 0x6C, 0x08, 0x04, 0x50, 0x48, 0x98, 0xC1, 0x49, 0xC1, 0x49])
    block[16] = 0x5E                                 # qs[0]
    block[48] = 0x3C                                 # qs[32]
    return bytes(block)


def test_worked_q4_k_block() -> None:
    packed = torch.frombuffer(bytearray(worked_q4_k_block()), dtype=torch.uint8).reshape(1, 144)
    y = dequantize(packed, GGMLType.Q4_K, 256)[0]
    assert (y[0].item(), y[32].item(), y[64].item()) == (8.71875, 1.75, 16.4375)
    ref = gguf.dequantize(packed.numpy(), gguf.GGMLQuantizationType.Q4_K).reshape(-1)
    assert np.array_equal(y.numpy(), ref)


def test_worked_block_scale_strip() -> None:
    sc, m = unpack_scale_min_k4(torch.tensor(list(worked_q4_k_block()[4:16]), dtype=torch.uint8).view(1, 12))
    assert sc.tolist() == [[20, 12, 44, 8, 33, 25, 17, 9]]
    assert m.tolist() == [[4, 16, 8, 24, 12, 20, 28, 36]]


def test_scale_min_packing_round_trips_all_pairs() -> None:
    """Every (sc, m) in 0..63 x 0..63, in every one of the 8 sub-block slots."""
    sc_all, m_all = torch.meshgrid(torch.arange(64), torch.arange(64), indexing="ij")
    sc_all, m_all = sc_all.reshape(-1), m_all.reshape(-1)                 # 4096 pairs
    for slot in range(8):
        # the other slots get shuffled values so cross-talk between fields shows
        sc = torch.randint(0, 64, (4096, 8)); m = torch.randint(0, 64, (4096, 8))
        sc[:, slot], m[:, slot] = sc_all, m_all
        packed = pack_scale_min_k4(sc, m)
        assert packed.dtype == torch.uint8 and packed.shape == (4096, 12)
        sc2, m2 = unpack_scale_min_k4(packed)
        assert torch.equal(sc2.long(), sc) and torch.equal(m2.long(), m), f"slot {slot}"


@pytest.mark.parametrize("bad, message", [
    (lambda: dequantize(torch.zeros(2, 143, dtype=torch.uint8), GGMLType.Q4_K, 256), "144 bytes"),
    (lambda: dequantize(torch.zeros(2, 144, dtype=torch.uint8), GGMLType.Q4_K, 250), "multiple"),
    (lambda: dequantize(torch.zeros(2, 144, dtype=torch.int8), GGMLType.Q4_K, 256), "uint8"),
    (lambda: dequantize(torch.zeros(2, 288, dtype=torch.uint8)[:, ::2], GGMLType.Q4_K, 256), "contiguous"),
    (lambda: dequantize(torch.zeros(2, 144, dtype=torch.uint8), 99, 256), "unknown GGML type"),
    (lambda: dequantize(torch.zeros(144, dtype=torch.uint8), GGMLType.Q4_K, 256), "2-D"),
    (lambda: dequantize(torch.zeros(2, 8, dtype=torch.uint8), GGMLType.NVFP4_E2M1, 16), "companions"),
    (lambda: dequantize(torch.zeros(2, 8, dtype=torch.uint8), GGMLType.NVFP4_E2M1, 16,
                        scales=torch.zeros(2, 2, dtype=torch.uint8), scale_2=1.0), "shape"),
    (lambda: dequantize(torch.zeros(2, 144, dtype=torch.uint8), GGMLType.Q4_K, 256,
                        out=torch.empty(2, 256, dtype=torch.float16)), "out must be float32"),
    (lambda: dequantize(torch.zeros(2, 144, dtype=torch.uint8), GGMLType.Q4_K, 256,
                        out=torch.empty(3, 256)), r"out must have shape \(2, 256\)"),
    (lambda: dequantize(torch.zeros(2, 144, dtype=torch.uint8), GGMLType.Q4_K, 256,
                        out=torch.empty(256, 2).t()), "out must be contiguous"),
    (lambda: dequantize(torch.zeros(2, 144, dtype=torch.uint8), GGMLType.Q4_K, 256,
                        out=[0.0] * 512), "out must be a torch.Tensor"),
])
def test_bad_input_names_the_problem(bad, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        bad()


def test_scale_byte_table_follows_the_layout():
    """Each format with one-byte float scales (an in-block field or a companion)
    gets their values, read from its layout's kind; the others get None. The
    values are checked against the bytes' float8 decode (E4M3FN) and half of
    the unsigned E4M3 formula (llama.cpp's NVFP4)."""
    from muser_torch.formats import scale_byte_table
    from muser_torch.formats.layout import LAYOUTS
    b = torch.arange(256)
    e4m3 = b.to(torch.uint8).view(torch.float8_e4m3fn).float()
    exp, man = (b >> 3) & 0xF, (b & 7).double()
    ue4m3 = torch.where(exp == 0, man * 2.0 ** -9, (1 + man / 8) * 2.0 ** (exp - 7).double())
    ue4m3 = torch.where((b == 0) | (b == 0x7F), 0.0, ue4m3 / 2).float()
    for qt in GGMLType:
        if qt.name not in LAYOUTS:
            continue
        table = scale_byte_table(qt)
        if qt in (GGMLType.NVFP4_E2M1, GGMLType.F8_E4M3FN):
            assert torch.equal(table.nan_to_num(7.0), e4m3.nan_to_num(7.0)), qt.name
        elif qt is GGMLType.NVFP4:
            assert torch.equal(table, ue4m3), qt.name
        else:
            assert table is None, qt.name
