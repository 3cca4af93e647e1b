"""Malformed files: each refusal is a GGUFError with a message naming the
problem; never a crash, a hang or a large allocation. The fuzz test mutates
a valid file thousands of times under the same guarantee."""
from __future__ import annotations

import struct
import sys
import tracemalloc

import numpy as np
import pytest
import torch

from muser_torch import GGMLType, GGUFError, load_gguf, save_gguf
from muser_torch.errors import (GGUFFormatError, GGUFTruncatedError, UnsupportedTypeError,
                                UnsupportedVersionError)
from muser_torch.inspect import summarize

from .helpers import (fresh_seed, kv_str, kv_u32, random_nvfp4, random_packed, raw_gguf, s,
                      tensor_info)

Q4K = int(GGMLType.Q4_K)


def _good(rng=None):
    """Two KVs and two tensors (a Q4_K matrix and an F32 vector) with their bytes."""
    rng = rng or np.random.default_rng(0)
    w = random_packed(rng, Q4K, 2, 1).numpy().tobytes()           # 288 bytes
    v = np.float32(rng.standard_normal(8)).tobytes()              # 32 bytes
    kvs = [kv_str("general.architecture", "test"), kv_u32("test.n", 7)]
    infos = [tensor_info("w", (256, 2), Q4K, 0), tensor_info("v", (8,), 0, 288)]
    return raw_gguf(kvs, infos, w + v)


def _load(tmp_path, data: bytes, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return load_gguf(p)


def _refused(tmp_path, data: bytes, error=GGUFError, match=None):
    with pytest.raises(error, match=match) as e:
        _load(tmp_path, data)
    return str(e.value)


def test_the_good_file_loads(tmp_path):
    f = _load(tmp_path, _good().data)
    assert f.metadata == {"general.architecture": "test", "test.n": 7}
    assert f["w"].packed.shape == (2, 144) and f["v"].ne == (8,)


def test_truncated_at_every_section_boundary_and_every_byte(tmp_path):
    good = _good()
    cut_points = sorted(set(good.marks.values()) | set(range(len(good.data))))
    for cut in cut_points:
        if cut >= good.marks["end"]:
            continue
        msg = _refused(tmp_path, good.data[:cut], GGUFTruncatedError)
        assert ("ends" in msg or "empty" in msg or "past the end" in msg), f"cut at {cut}: {msg}"
    for section in ("magic", "version", "tensor_count", "kv_count", "kv0", "kv1", "info0", "info1"):
        msg = _refused(tmp_path, good.data[:good.marks[section]], GGUFTruncatedError)
        assert msg, section


def test_wrong_magic(tmp_path):
    msg = _refused(tmp_path, b"GGML" + _good().data[4:], GGUFFormatError, "not a GGUF file")
    assert "b'GGML'" in msg


@pytest.mark.parametrize("version, match", [(1, "version 1 is not supported"),
                                            (4, "version 4 is not supported"),
                                            (0x03000000, "big-endian")])
def test_unsupported_versions(tmp_path, version, match):
    data = bytearray(_good().data)
    struct.pack_into("<I", data, 4, version)
    _refused(tmp_path, bytes(data), UnsupportedVersionError, match)


def test_tensor_data_past_end_of_file(tmp_path):
    good = _good()
    msg = _refused(tmp_path, good.data[:-4], GGUFTruncatedError, "runs past the end of the file")
    assert "'v'" in msg


def test_overlapping_tensors(tmp_path):
    infos = [tensor_info("w", (256, 2), Q4K, 0), tensor_info("v", (8,), 0, 256)]
    bad = raw_gguf([], infos, bytes(320))
    msg = _refused(tmp_path, bad.data, GGUFFormatError, "overlap")
    assert "'w'" in msg and "'v'" in msg


def test_misaligned_offset(tmp_path):
    infos = [tensor_info("w", (256, 2), Q4K, 0), tensor_info("v", (8,), 0, 290)]
    _refused(tmp_path, raw_gguf([], infos, bytes(400)).data, GGUFFormatError,
             "'v': data offset 290 is not a multiple of the alignment 32")


def test_custom_alignment_is_honoured(tmp_path):
    infos = [tensor_info("w", (256, 2), Q4K, 0), tensor_info("v", (8,), 0, 304)]
    ok = raw_gguf([kv_u32("general.alignment", 16)], infos, bytes(336), alignment=16)
    f = _load(tmp_path, ok.data)
    assert f.alignment == 16 and f["v"].offset == ok.marks["data_start"] + 304
    for a in (0, 3, 48):
        _refused(tmp_path, raw_gguf([kv_u32("general.alignment", a)], []).data,
                 GGUFFormatError, "general.alignment.*power of two")
    _refused(tmp_path, raw_gguf([kv_str("general.alignment", "32")], []).data,
             GGUFFormatError, "general.alignment")


@pytest.mark.parametrize("what", ["tensor_count", "kv_count", "key_len", "str_len", "array_len",
                                  "name_len", "n_dims"])
def test_absurd_counts_fail_fast_without_allocating(tmp_path, what):
    huge = 2**63 + 12345
    kvs, infos, counts = [kv_str("k", "v")], [tensor_info("t", (8,), 0, 0)], {}
    if what == "tensor_count":
        counts["n_tensors"] = huge
    elif what == "kv_count":
        counts["n_kv"] = huge
    elif what == "key_len":
        kvs = [struct.pack("<Q", huge) + b"k"]
    elif what == "str_len":
        kvs = [s("k") + struct.pack("<IQ", 8, huge) + b"v"]
    elif what == "array_len":
        kvs = [s("k") + struct.pack("<IIQ", 9, 8, huge)]         # array of 2**63 strings
    elif what == "name_len":
        infos = [struct.pack("<Q", huge) + b"t"]
    elif what == "n_dims":
        infos = [s("t") + struct.pack("<I", 2**31) + struct.pack("<Q", 8)]
    data = raw_gguf(kvs, infos, bytes(32), **counts).data
    calls = []
    tracemalloc.start()
    sys.setprofile(lambda frame, event, arg: calls.append(1) if event == "call" else None)
    try:
        msg = _refused(tmp_path, data)
    finally:
        sys.setprofile(None)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    # Work done, not time: a refusal before any per-entry loop is a few hundred
    # Python calls, whatever the claimed count.
    assert len(calls) < 2000, f"{what}: {len(calls)} Python calls before refusing"
    assert peak < 1 << 20, f"{what}: allocated {peak} bytes before refusing"
    assert str(huge) in msg or str(2**31) in msg, msg


def test_huge_dimensions(tmp_path):
    infos = [tensor_info("t", (256, 2**40), Q4K, 0)]
    _refused(tmp_path, raw_gguf([], infos, bytes(288)).data, GGUFTruncatedError, "'t'.*past the end")
    infos = [tensor_info("t", (2**62, 4), 0, 0)]
    _refused(tmp_path, raw_gguf([], infos, bytes(64)).data, GGUFFormatError, "invalid shape")


def test_duplicate_names(tmp_path):
    infos = [tensor_info("w", (8,), 0, 0), tensor_info("w", (8,), 0, 32)]
    _refused(tmp_path, raw_gguf([], infos, bytes(64)).data, GGUFFormatError, "'w' appears twice")
    kvs = [kv_u32("a", 1), kv_u32("a", 2)]
    _refused(tmp_path, raw_gguf(kvs, []).data, GGUFFormatError, "key 'a' appears twice")


def test_byte_size_that_does_not_match_the_shape(tmp_path):
    infos = [tensor_info("w", (100, 2), Q4K, 0)]
    _refused(tmp_path, raw_gguf([], infos, bytes(288)).data, GGUFFormatError,
             "'w': rows of 100 elements do not fill whole Q4_K blocks of 256")


@pytest.mark.parametrize("kv, match", [
    (s("k") + struct.pack("<I", 13), "unknown value type 13"),
    (s("k") + struct.pack("<IIQ", 9, 9, 1) + struct.pack("<IQ", 4, 0), "array of arrays"),
    (s("k") + struct.pack("<IIQ", 9, 77, 1), "unknown value type 77"),
    (s(b"\xff\xfe") + struct.pack("<II", 4, 1), "not valid UTF-8"),
    (s("k") + struct.pack("<I", 8) + s(b"\xc3("), "'k' .*not valid UTF-8"),
])
def test_bad_metadata_values(tmp_path, kv, match):
    _refused(tmp_path, raw_gguf([kv], []).data, GGUFFormatError, match)


def test_bad_tensor_infos(tmp_path):
    _refused(tmp_path, raw_gguf([], [tensor_info("t", (1, 1, 1, 1, 1), 0, 0)], bytes(32)).data,
             GGUFFormatError, "5 dimensions, at most 4")
    _refused(tmp_path, raw_gguf([], [tensor_info("t", (8, 0), 0, 0)], bytes(32)).data,
             GGUFFormatError, "invalid shape")
    _refused(tmp_path, b"", GGUFTruncatedError, "empty")


def test_unknown_types_are_listed_and_refused_on_use(tmp_path):
    infos = [tensor_info("iq", (256, 2), 16, 0),        # IQ2_XXS: gguf knows its size
             tensor_info("new", (8,), 4242, 160),        # nobody knows this id
             tensor_info("ok", (8,), 0, 192)]
    f = _load(tmp_path, raw_gguf([], infos, bytes(224)).data)
    assert [t.type_name for t in f.tensors.values()] == ["IQ2_XXS", "type4242", "F32"]
    assert f["iq"].nbytes == 132 and f["iq"].raw.numel() == 132 and f["new"].nbytes is None
    with pytest.raises(UnsupportedTypeError, match="'iq' has type IQ2_XXS"):
        f["iq"].packed
    with pytest.raises(UnsupportedTypeError, match="'new'.*4242"):
        f["new"].raw
    with pytest.raises(UnsupportedTypeError):
        f.dequantize("iq")
    assert summarize(f).unsized_tensors == 1



def _peak_alloc(fn) -> int:
    """Peak bytes allocated through Python's allocators while ``fn`` runs."""
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("kind", ["int32 array", "string"])
def test_values_are_read_only_after_the_header_checks_out(tmp_path, kind):
    """A corrupt count or length that still fits the file must not become
    Python objects (36 bytes an int, or a str as long as the file) before
    the garbage after it is noticed."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    n = 1 << 20
    if kind == "string":
        entry = s("big") + struct.pack("<I", 8) + s(b"x" * (4 * n))
        want = "x" * (4 * n)
    else:
        items = rng.integers(1 << 20, 1 << 30, n, dtype=np.int32)     # no small-int cache
        entry = s("big") + struct.pack("<IIQ", 9, 5, n) + items.tobytes()
        want = items.tolist()
    garbage = struct.pack("<Q", 2**40)                                 # key length past the end
    path = tmp_path / "deferred.gguf"
    path.write_bytes(raw_gguf([entry, garbage], [], n_kv=2).data)
    tracemalloc.start()
    try:
        with pytest.raises(GGUFTruncatedError, match="metadata key 1"):
            load_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"seed {seed}: {peak:,} bytes allocated before refusing"
    # the same value in a valid file reads back exactly
    path.write_bytes(raw_gguf([entry], []).data)
    assert load_gguf(path).metadata["big"] == want, f"seed {seed}"


def test_spec_limits_on_key_and_tensor_name_lengths(tmp_path):
    ok = raw_gguf([kv_u32("k" * 65535, 1)], [tensor_info("t" * 64, (8,), 0, 0)], bytes(32)).data
    f = _load(tmp_path, ok)
    assert list(f.metadata) == ["k" * 65535] and list(f.tensors) == ["t" * 64]
    _refused(tmp_path, raw_gguf([kv_u32("k" * 65536, 1)], []).data, GGUFFormatError,
             "metadata key 0 .* is 65536 bytes long; the GGUF spec allows at most 65535")
    _refused(tmp_path, raw_gguf([], [tensor_info("t" * 65, (8,), 0, 0)], bytes(32)).data,
             GGUFFormatError, "the name of tensor 0 .* is 65 bytes long; the GGUF spec allows at most 64")


def test_a_long_string_is_decoded_without_a_copy(tmp_path):
    """Bytes allocated while reading an 8 MB value: the str itself, not a
    bytes copy of the map on top of it."""
    text = "x" * (8 << 20)
    path = tmp_path / "long.gguf"
    path.write_bytes(raw_gguf([kv_str("long", text)], []).data)
    holder = {}
    peak = _peak_alloc(lambda: holder.setdefault("f", load_gguf(path)))
    assert holder["f"].metadata["long"] == text
    assert peak < 1.25 * len(text), f"{peak:,} bytes allocated to read {len(text):,}"


# ---- fuzz ---------------------------------------------------------------------

_EXTREMES = [0, 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63, 2**64 - 1]


def _mutate(rng: np.random.Generator, data: bytes, header_end: int) -> bytes:
    b = bytearray(data)
    kind = rng.integers(6)
    pos = int(rng.integers(header_end))
    if kind == 0:                                   # flip a few random bits
        for _ in range(int(rng.integers(1, 4))):
            i = int(rng.integers(header_end))
            b[i] ^= 1 << int(rng.integers(8))
    elif kind == 1:                                 # an extreme u64 or u32
        v = _EXTREMES[int(rng.integers(len(_EXTREMES)))]
        if rng.integers(2):
            b[pos:pos + 8] = v.to_bytes(8, "little")
        else:
            b[pos:pos + 4] = (v & 0xFFFFFFFF).to_bytes(4, "little")
    elif kind == 2:                                 # truncate
        del b[int(rng.integers(len(b))):]
    elif kind == 3:                                 # delete a run
        del b[pos:pos + int(rng.integers(1, 16))]
    elif kind == 4:                                 # insert random bytes
        b[pos:pos] = rng.integers(0, 256, int(rng.integers(1, 16)), dtype=np.uint8).tobytes()
    else:                                           # random byte values
        for _ in range(int(rng.integers(1, 8))):
            b[int(rng.integers(header_end))] = int(rng.integers(256))
    return bytes(b[:len(b)])


def _use(f) -> None:
    """Everything a caller may do with a file that loaded."""
    summarize(f)
    for name, t in f.tensors.items():
        try:
            if t.nbytes is not None:
                t.raw.sum()
            if t.qtype is not None and t.n_elements <= 1 << 16:
                f.dequantize(name)
        except GGUFError:
            pass


def _fuzz_base(tmp_path, rng) -> tuple[bytes, int]:
    """A small file with every kind of header entry: string, int, bool and
    float arrays, a custom alignment, an NVFP4 tensor with its companions and a
    type that is listed but not computed. Returns (bytes, data start)."""
    payload, scales, scale_2 = random_nvfp4(rng, 2, 32)
    path = tmp_path / "base.gguf"
    save_gguf(path, {"general.architecture": "test", "general.alignment": 64,
                     "tok.list": ["a", "bc", ""], "ints": [1, -2, 3], "flags": [True, False],
                     "scores": [0.5, -1.0], "flag": True, "f": 0.25, "name": "x"},
              {"w": (GGMLType.Q4_K, random_packed(rng, Q4K, 2, 1)),
               "v": (GGMLType.F32, torch.from_numpy(rng.standard_normal(8).astype(np.float32))),
               "n.weight": (GGMLType.NVFP4_E2M1, payload),
               "n.weight_scale": (GGMLType.F8_E4M3FN, scales),
               "n.weight_scale_2": (GGMLType.F32, scale_2),
               "q2": (10, random_packed(rng, 10, 1, 1))}, progress=False)
    return path.read_bytes(), load_gguf(path).data_offset


FUZZ_MUTATIONS = 1500   # a fixed count, not a time budget (about 4 s)


def test_fuzz_mutations_raise_only_gguf_errors(tmp_path):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    base_data, data_start = _fuzz_base(tmp_path, rng)
    path = tmp_path / "fuzz.gguf"
    counts = {"loaded": 0, "refused": 0}
    n = 0
    while n < FUZZ_MUTATIONS:
        data = _mutate(rng, base_data, data_start)
        if rng.integers(4) == 0 and len(data) > 1:      # sometimes mutate twice
            data = _mutate(rng, data, min(len(data), data_start))
        path.write_bytes(data)
        try:
            f = load_gguf(path)
        except GGUFError:
            counts["refused"] += 1
        except Exception as e:      # noqa: BLE001 - anything else is the bug we hunt
            pytest.fail(f"seed {seed} mutation {n}: {type(e).__name__}: {e}\n"
                        f"header: {data[:data_start].hex()}")
        else:
            counts["loaded"] += 1
            _use(f)
        n += 1
    print(f"fuzz seed {seed}: {n} mutations, {counts}")
    assert counts["refused"] > n // 4 and counts["loaded"] > 0, f"seed {seed}: {counts}"
