"""Shared pieces of the GGUF tests: fresh seeds, random tensors of every type,
and ``raw_gguf``, a byte-level writer independent of ``save_gguf`` for
crafting malformed files."""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from muser_torch.formats import GGMLType, random_weight

from .ggml_gguf import lib as ggml_lib
from ..random_seed import fresh_seed  # noqa: F401 (its tests import it from here)


def ggml_block_size(type_id: int) -> tuple[int, int]:
    dll = ggml_lib()
    return int(dll.ggml_blck_size(type_id)), int(dll.ggml_type_size(type_id))


def every_type_id() -> list[int]:
    """Every tensor type id with a known block size: ours, then gguf's others."""
    ours = [int(t) for t in GGMLType]
    return ours + [int(t) for t in GGMLQuantizationType
                   if int(t) not in ours and t in GGML_QUANT_SIZES]


def geometry(type_id: int) -> tuple[int, int]:
    """Block (elements, bytes) asked of ggml itself (the reference); the
    Muser-native ids come from docs/muse-glimmer.md ("The lanes and their fences")."""
    if type_id in (1000, 1001):
        return {1000: (16, 8), 1001: (1, 1)}[type_id]
    return ggml_block_size(type_id)


def random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=n, dtype=np.uint8)


def random_packed(rng: np.random.Generator, type_id: int, n_out: int, blocks_per_row: int
                  ) -> torch.Tensor:
    """Random uint8 ``[n_out, row_bytes]`` rows of ``type_id``."""
    _, block_bytes = geometry(type_id)
    return torch.from_numpy(random_bytes(rng, n_out * blocks_per_row * block_bytes)
                            .reshape(n_out, blocks_per_row * block_bytes))


# ---- a raw writer for bad files ------------------------------------------------

def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv_u32(key: str, v: int) -> bytes:
    return s(key) + struct.pack("<II", 4, v)


def kv_str(key: str, v: str | bytes) -> bytes:
    return s(key) + struct.pack("<I", 8) + s(v)


def tensor_info(name: str | bytes, ne: tuple[int, ...], type_id: int, offset: int) -> bytes:
    return (s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", d) for d in ne)
            + struct.pack("<I", type_id) + struct.pack("<Q", offset))


@dataclass
class RawFile:
    """A GGUF assembled field by field; ``marks`` are the section boundaries."""
    data: bytes
    marks: dict[str, int] = field(default_factory=dict)


def raw_gguf(kvs: list[bytes], infos: list[bytes], tensor_data: bytes = b"", *,
             version: int = 3, magic: bytes = b"GGUF", alignment: int = 32,
             n_tensors: int | None = None, n_kv: int | None = None) -> RawFile:
    out, marks = bytearray(magic), {"magic": 4}
    out += struct.pack("<I", version)
    marks["version"] = len(out)
    out += struct.pack("<Q", len(infos) if n_tensors is None else n_tensors)
    marks["tensor_count"] = len(out)
    out += struct.pack("<Q", len(kvs) if n_kv is None else n_kv)
    marks["kv_count"] = len(out)
    for i, kv in enumerate(kvs):
        out += kv
        marks[f"kv{i}"] = len(out)
    for i, info in enumerate(infos):
        out += info
        marks[f"info{i}"] = len(out)
    out += bytes(-len(out) % alignment)
    marks["data_start"] = len(out)
    out += tensor_data
    marks["end"] = len(out)
    return RawFile(bytes(out), marks)


# ---- NVFP4_E2M1 reference (docs/muse-glimmer.md) ----------------------------------------

E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def nvfp4_reference(payload: np.ndarray, scales: np.ndarray, scale_2) -> np.ndarray:
    """w = e2m1(code) * e4m3fn(scale) * scale_2, element 2i in the low nibble."""
    codes = np.stack([payload & 0xF, payload >> 4], axis=-1).reshape(payload.shape[0], -1)
    sc = torch.from_numpy(np.ascontiguousarray(scales)).view(torch.float8_e4m3fn).float().numpy()
    return (E2M1[codes] * np.repeat(sc, 16, axis=1)) * np.float32(scale_2)


def _torch_generator(rng: np.random.Generator) -> torch.Generator:
    return torch.Generator().manual_seed(int(rng.integers(1 << 62)))


def random_nvfp4(rng: np.random.Generator, n_out: int, n_in: int):
    """(payload, scales, scale_2) torch tensors with finite scales (``formats.random_weight``)."""
    w = random_weight(GGMLType.NVFP4_E2M1, n_out, n_in, generator=_torch_generator(rng))
    return w.packed, w.scales, w.scale_2.reshape(())


def finite_kquant(rng: np.random.Generator, type_id: int, n_out: int, n_in: int) -> torch.Tensor:
    """Random K-quant rows whose f16 super-block scales are finite and small."""
    return random_weight(type_id, n_out, n_in, generator=_torch_generator(rng)).packed
