"""save_gguf -> load_gguf for every tensor type and every metadata value type;
files of standard types also checked by gguf's GGUFReader and llama.cpp's
own parser (gguf.cpp through libggml)."""
from __future__ import annotations

import math
import struct

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGUFValueType as VT

from muser_torch import GGMLType, load_gguf, save_gguf
from muser_torch.errors import CompanionError, UnsupportedTypeError
from muser_torch.gguf_io import type_name

from .ggml_gguf import padded_ne, read_header
from .helpers import (every_type_id, fresh_seed, geometry, nvfp4_reference, random_nvfp4,
                      random_packed)

MUSER_NATIVE = (1000, 1001)


def _shapes(rng, type_id):
    """A few shapes per type: a matrix, a 1-D row and (sometimes) a 3-D tensor."""
    elems, _ = geometry(type_id)
    k = int(rng.integers(1, 4))
    return [(elems * k, int(rng.integers(1, 6))), (elems * k,), (elems, 2, 3)]


def _random_tensors(rng, type_ids):
    tensors, expect = {}, {}
    for tid in type_ids:
        for j, ne in enumerate(_shapes(rng, tid)):
            elems, block_bytes = geometry(tid)
            n_out = math.prod(ne[1:])
            packed = random_packed(rng, tid, n_out, ne[0] // elems)
            name = f"t{tid}.{j}"
            tensors[name] = (tid, packed, ne) if j else (tid, packed)  # ne inferred for matrices
            expect[name] = (tid, ne, packed)
    return tensors, expect


@pytest.mark.parametrize("alignment", [None, 1, 64, 4096])
def test_every_type_round_trips(tmp_path, alignment):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    tensors, expect = _random_tensors(rng, every_type_id())
    md = {"general.architecture": "test", "x.seed": seed % 1000}
    if alignment is not None:
        md["general.alignment"] = alignment
    path = tmp_path / "all.gguf"
    save_gguf(path, md, tensors)
    f = load_gguf(path)
    assert f.alignment == (alignment or 32)
    assert list(f.tensors) == list(expect), f"seed {seed}: tensor order changed"
    for name, (tid, ne, packed) in expect.items():
        t = f.tensors[name]
        assert (t.type_id, t.ne) == (tid, ne), f"seed {seed} {name}"
        assert t.offset % f.alignment == 0
        assert torch.equal(t.raw, packed.reshape(-1)), f"seed {seed}: {name} bytes differ"
        if t.qtype is not None:
            assert torch.equal(t.packed, packed.reshape(t.n_out, -1)), f"seed {seed} {name}"
        else:
            with pytest.raises(UnsupportedTypeError, match=type_name(tid)):
                t.packed


def test_standard_types_open_in_gguf_and_ggml(tmp_path):
    """Every type llama.cpp knows: gguf's GGUFReader and gguf.cpp see the
    same shapes, types, offsets and bytes as we wrote."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    standard = [t for t in every_type_id() if t not in MUSER_NATIVE]
    tensors, expect = _random_tensors(rng, standard)
    md = {"general.architecture": "test", "general.alignment": 64, "k.list": [1, 2, 3]}
    path = tmp_path / "std.gguf"
    save_gguf(path, md, tensors)

    reader = gguf.GGUFReader(path)
    assert reader.alignment == 64
    by_name = {t.name: t for t in reader.tensors}
    for name, (tid, ne, packed) in expect.items():
        if tid == 9:
            continue  # gguf-py sizes Q8_1 blocks as 40 bytes, ggml as 36 (see gguf_io)
        rt = by_name[name]
        assert int(rt.tensor_type) == tid and tuple(rt.shape.tolist()) == ne, f"seed {seed} {name}"
        got = np.asarray(rt.data).view(np.uint8).reshape(-1)
        assert np.array_equal(got, packed.numpy().reshape(-1)), f"seed {seed}: {name} bytes differ"

    ggml = read_header(path)
    assert ggml is not None, "llama.cpp's gguf.cpp refused a file save_gguf wrote"
    assert ggml.metadata["k.list"] == [1, 2, 3]
    raw = path.read_bytes()
    for name, (tid, ne, packed) in expect.items():
        info = ggml.tensors[name]
        assert (info.type_id, info.ne) == (tid, padded_ne(ne)), f"seed {seed} {name}"
        assert raw[info.offset:info.offset + info.size] == packed.numpy().tobytes(), f"seed {seed} {name}"


def test_metadata_value_types_round_trip(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    ints = {VT.UINT8: (0, 255), VT.INT8: (-128, 127), VT.UINT16: (0, 65535), VT.INT16: (-32768, 32767),
            VT.UINT32: (0, 2**32 - 1), VT.INT32: (-2**31, 2**31 - 1),
            VT.UINT64: (0, 2**64 - 1), VT.INT64: (-2**63, 2**63 - 1)}
    md, types = {}, {}
    for vt, (lo, hi) in ints.items():
        vals = [lo, hi] + [int(rng.integers(lo, hi, endpoint=True, dtype=np.uint64 if lo == 0 else np.int64))
                           for _ in range(3)]
        md[f"s.{vt.name}"], types[f"s.{vt.name}"] = vals[2], vt
        md[f"a.{vt.name}"], types[f"a.{vt.name}"] = vals, vt
    f32 = [float(np.float32(x)) for x in rng.standard_normal(5)]
    md["s.f32"], md["a.f32"] = f32[0], f32
    md["s.f64"], types["s.f64"] = float(rng.standard_normal()), VT.FLOAT64
    md["a.f64"], types["a.f64"] = rng.standard_normal(4).tolist(), VT.FLOAT64
    md["s.bool"], md["a.bool"] = True, [True, False, bool(rng.integers(2))]
    md["s.str"], md["a.str"] = "glimmer ✓", ["", "ü", "<0x0A>", str(seed)]
    md["a.empty"], types["a.empty"] = [], VT.INT32
    md["infer.big"], md["infer.neg"] = 2**40, -5      # inferred INT64
    path = tmp_path / "md.gguf"
    save_gguf(path, md, {}, types=types)
    f = load_gguf(path)
    assert f.metadata == md, f"seed {seed}"
    assert f.metadata_types["infer.big"] == VT.INT64 and f.metadata_types["infer.neg"] == VT.INT64
    assert f.metadata_types["s.f32"] == VT.FLOAT32 and f.metadata_types["s.bool"] == VT.BOOL
    ggml = read_header(path)
    assert ggml is not None and ggml.metadata == md, f"seed {seed}: llama.cpp reads other values"
    assert ggml.kv_types == {k: int(v) for k, v in f.metadata_types.items()}

    # Writing back with the recorded types reproduces the file byte for byte.
    again = tmp_path / "again.gguf"
    save_gguf(again, f.metadata, f.tensors, types=f.metadata_types)
    assert again.read_bytes() == path.read_bytes()


def test_version_2_reads_like_version_3(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    packed = random_packed(rng, GGMLType.Q4_K, 3, 2)
    path = tmp_path / "v3.gguf"
    save_gguf(path, {"a": 1}, {"w": (GGMLType.Q4_K, packed)})
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 4, 2)          # v2 and v3 share the layout
    (tmp_path / "v2.gguf").write_bytes(raw)
    f = load_gguf(tmp_path / "v2.gguf")
    assert f.version == 2 and torch.equal(f["w"].packed, packed), f"seed {seed}"


def test_float_tensors_and_sparse_zeros(tmp_path):
    seed = fresh_seed()
    g = torch.Generator().manual_seed(seed)
    norm = torch.randn(7, 5, generator=g)
    half = torch.randn(3, 4, generator=g).half()
    path = tmp_path / "f.gguf"
    save_gguf(path, {}, {"norm": (GGMLType.F32, norm), "half": ("f16", half),
                         "zeros": (GGMLType.Q6_K, None, (256, 4))})
    f = load_gguf(path)
    assert f["norm"].ne == (5, 7) and torch.equal(f.dequantize("norm"), norm), f"seed {seed}"
    assert torch.equal(f.dequantize("half"), half.float()), f"seed {seed}"
    assert f["zeros"].nbytes == 4 * 210 and not f["zeros"].raw.any()
    assert torch.equal(f.dequantize("zeros", rows=[3, 1]), torch.zeros(2, 256))


def test_nvfp4_companions_bind_and_dequantize(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    payload, scales, scale_2 = random_nvfp4(rng, 6, 64)
    ref = torch.from_numpy(nvfp4_reference(payload.numpy(), scales.numpy(), scale_2))
    path = tmp_path / "nv.gguf"
    save_gguf(path, {}, {"w.weight": (GGMLType.NVFP4_E2M1, payload),
                         "w.weight_scale": (GGMLType.F8_E4M3FN, scales),
                         "w.weight_scale_2": (GGMLType.F32, scale_2)})
    f = load_gguf(path)
    assert f["w.weight"].ne == (64, 6) and f["w.weight_scale"].ne == (4, 6)
    assert torch.equal(f.dequantize("w.weight"), ref), f"seed {seed}"
    assert torch.equal(f.dequantize("w.weight", rows=[5, 0]), ref[[5, 0]]), f"seed {seed}"
    s, s2 = f.companions("w.weight")
    assert s.dtype == torch.float8_e4m3fn and torch.equal(s.view(torch.uint8), scales)
    assert float(s2) == float(scale_2)

    save_gguf(tmp_path / "lonely.gguf", {}, {"w.weight": (GGMLType.NVFP4_E2M1, payload)})
    with pytest.raises(CompanionError, match=r"w\.weight_scale.*missing"):
        load_gguf(tmp_path / "lonely.gguf").dequantize("w.weight")


@pytest.mark.parametrize("spec, match", [
    ((GGMLType.Q4_K, torch.zeros(2, 100, dtype=torch.uint8)), "not whole Q4_K blocks"),
    ((GGMLType.Q4_K, torch.zeros(2, 144, dtype=torch.uint8), (256, 3)), "is 432 bytes, data has 288"),
    ((GGMLType.Q4_K, None, (100, 2)), "not a multiple of the Q4_K block size 256"),
    ((GGMLType.Q4_K, None), "without ne"),
    ((GGMLType.F32, torch.zeros(3, dtype=torch.float16)), "without ne"),
    ((999, None, (4,)), "type id 999 has no known block size"),
    (("Q9_Z", None, (4,)), "unknown type name"),
    ((GGMLType.F32, None, (0, 2)), "positive dimensions"),
    ((GGMLType.F32, None, (1, 1, 1, 1, 1)), "at most 4"),
    ((GGMLType.F32, [1.0, 2.0], (2,)), "data must be"),
    ("not a tuple", "expected a GGUFTensor"),
])
def test_save_rejects_bad_tensors(tmp_path, spec, match):
    with pytest.raises(ValueError, match=match):
        save_gguf(tmp_path / "bad.gguf", {}, {"t": spec})
    assert not list(tmp_path.iterdir()), "a failed save left a file behind"


@pytest.mark.parametrize("md, types, match", [
    ({"general.alignment": 48}, None, "power of two"),
    ({"k": object()}, None, "cannot infer"),
    ({"k": [1, "a"]}, None, "cannot infer"),
    ({"k": []}, None, "empty list"),
    ({"k": [[1]]}, None, "cannot infer"),
    ({"k": 2**64}, None, "does not fit"),
    ({"k": 300}, {"k": VT.UINT8}, "out of range"),
    ({"k": 1.5}, {"k": VT.INT32}, "integer"),
    ({"k": 1}, {"k": VT.ARRAY}, "item type"),
])
def test_save_rejects_bad_metadata(tmp_path, md, types, match):
    with pytest.raises(ValueError, match=match):
        save_gguf(tmp_path / "bad.gguf", md, {}, types=types)


def test_save_rejects_long_names(tmp_path):
    with pytest.raises(ValueError, match="longer than 63 bytes"):
        save_gguf(tmp_path / "bad.gguf", {}, {"x" * 64: (GGMLType.F32, None, (1,))})


def test_progress_bar_for_large_writes(tmp_path, capsys):
    save_gguf(tmp_path / "p.gguf", {}, {"z": (GGMLType.F32, None, (1024,))}, progress=True)
    assert "writing p.gguf" in capsys.readouterr().err
