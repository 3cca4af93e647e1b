"""ctypes mirror of ``decode.c``'s block description (``block_t``) and the
calls that take it. The field order here is the C struct's; the library's
``muser_block_size`` is checked against it when the first block is built.
``step.py`` fills these from ``models/layer_plan.py``'s plans of a model's layers."""
from __future__ import annotations

import ctypes
from ctypes import c_float, c_int, c_int64, c_void_p

import torch

from ...formats.types import GGMLType
from ...formats import scale_byte_table
from . import GGML_NUMERICS_TYPES, _native_for

__all__ = ["Linear", "Norm", "Block", "ROPE", "ACTIVATIONS", "MUL", "ABSENT", "linear", "norm",
           "rmsnorm", "block_work", "ATTN_ISA_NAMES", "attn_isa", "fa_row", "f16_round_mismatches"]

# decode.c's enums
ROPE = {"none": 0, "neox": 1, "normal": 2}
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}
MUL = {"float": 0, "q8": 1, "rounded": 2, "q8p": 3}   # q8p: q8 on the repack (ops/cpu/packed.py)


class Linear(ctypes.Structure):
    _fields_ = [("type", c_int), ("mul", c_int), ("packed", c_void_p), ("scales", c_void_p),
                ("lut", c_void_p), ("s2", c_float), ("n_out", c_int64), ("n_in", c_int64),
                ("bias", c_void_p)]


class Norm(ctypes.Structure):
    _fields_ = [("w", c_void_p), ("eps", c_float)]


class Block(ctypes.Structure):
    _fields_ = [("hidden", c_int64), ("n_heads", c_int64), ("n_kv", c_int64),
                ("head_dim", c_int64), ("ffn", c_int64),
                *((name, Norm) for name in ("attn_norm", "q_norm", "k_norm", "post_attn_norm",
                                            "ffn_norm", "post_ffw_norm")),
                *((name, Linear) for name in ("wq", "wk", "wv", "wgate", "wo", "w_gate", "w_up",
                                              "w_down")),
                ("rope", c_int), ("act", c_int), ("n_rot", c_int64), ("mscale", c_float),
                ("scale", c_float), ("k_cache", c_void_p), ("v_cache", c_void_p),
                ("capacity", c_int64), ("ggml", c_int), ("scale_q", c_int)]


ABSENT = Linear(type=-1)


def linear(packed: torch.Tensor, qtype: GGMLType, n_out: int, n_in: int,
           scales: torch.Tensor | None, scale_2: torch.Tensor | None, numerics: str,
           bias: torch.Tensor | None, repacked: torch.Tensor | None = None) -> Linear | None:
    """One projection as the block runs it, as ``qmatmul`` (``numerics``
    "exact") or ``qmatmul_ggml`` compute it on the library; None for a type
    the library does not run. In the ggml numerics ``repacked`` (``packed``
    through ``ops/cpu/packed.repack``), when given, is what it reads: the same
    values bit for bit, faster. The caller keeps the tensors alive."""
    if _native_for(qtype) is None or not packed.is_contiguous():
        return None
    mul = MUL["float"]
    if numerics == "ggml" and qtype in GGML_NUMERICS_TYPES:
        mul = MUL["rounded"] if qtype in (GGMLType.F16, GGMLType.BF16) else MUL["q8"]
        if repacked is not None and mul == MUL["q8"]:
            mul, packed = MUL["q8p"], repacked
    lut = scale_byte_table(qtype)
    return Linear(type=int(qtype), mul=mul, packed=packed.data_ptr(),
                  scales=None if scales is None else scales.data_ptr(),
                  lut=None if lut is None else lut.data_ptr(),
                  s2=0.0 if scale_2 is None else float(scale_2), n_out=n_out, n_in=n_in,
                  bias=None if bias is None else bias.data_ptr())


def norm(weight: torch.Tensor | None, eps: float) -> Norm:
    return Norm(w=None if weight is None else weight.data_ptr(), eps=eps)


def block_work(lib, block: Block, rows: int) -> int:
    """Floats of scratch ``decode_block`` needs for ``rows`` sequences."""
    if lib.muser_block_size() != ctypes.sizeof(Block):
        raise RuntimeError(f"decode.c's block_t is {lib.muser_block_size()} bytes, "
                           f"ops/cpu/block.py's Block {ctypes.sizeof(Block)}: they must match")
    return lib.muser_block_work(ctypes.byref(block), rows)


def rmsnorm(lib, x: torch.Tensor, weight: torch.Tensor | None, eps: float,
            ggml: bool = False) -> torch.Tensor:
    """``models.parts.RMSNorm`` of float32 contiguous x on the library; with
    ``ggml``, as ggml-cpu computes it (the squares summed one by one in double)."""
    out = torch.empty_like(x)
    n = x.shape[-1]
    norm = lib.muser_rmsnorm_ggml if ggml else lib.muser_rmsnorm
    norm(x.data_ptr(), None if weight is None else weight.data_ptr(), eps, x.numel() // n, n,
         out.data_ptr())
    return out


# ---- the ggml block's f16 flash attention (attn_f16.c) -------------------------------------

ATTN_ISA_NAMES = ("plain C", "AVX2 + F16C", "AVX-512")


def attn_isa(lib, force: int | None = None) -> int:
    """The f16 attention kernels in use (an index into ``ATTN_ISA_NAMES``);
    ``force`` selects a lower level (the tests run every one the CPU has),
    ValueError if the CPU lacks it."""
    if force is not None and force not in range(len(ATTN_ISA_NAMES)):
        raise ValueError(f"attention kernels: isa must be one of 0..{len(ATTN_ISA_NAMES) - 1}, got {force!r}")
    got = lib.muser_attn_isa(-1 if force is None else int(force))
    if got < 0:
        raise ValueError(f"attention kernels: this CPU cannot run {ATTN_ISA_NAMES[force]}")
    return got


def fa_row(lib, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_scale: float, scale: float,
           width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One query row as the ggml block attends: q float32 [D], k and v float32
    [n, stride >= D] of f16 values; q_scale multiplies q before its f16
    rounding, scale the scores; ``width`` the emulated f16 dot's lanes (16, 8
    or 0). Returns (q as f16, the output row), float32 [D] each."""
    n, D = k.shape[0], q.shape[0]
    assert k.shape == v.shape and k.stride() == v.stride() and k.stride(1) == 1 and k.shape[1] >= D
    q, qh, o = q.contiguous(), torch.empty(D), torch.empty(D)
    lib.muser_fa_row(q.data_ptr(), k.data_ptr(), v.data_ptr(), n, D, k.stride(0),
                     q_scale, scale, width, qh.data_ptr(), o.data_ptr())
    return qh, o


def f16_round_mismatches(lib, bits: torch.Tensor) -> int:
    """How many of the float32 bit patterns ``bits`` (int32) the library's software
    f16 rounding rounds otherwise than F16C; -1 when the CPU has no F16C."""
    bits = bits.contiguous()
    assert bits.dtype == torch.int32
    return lib.muser_f16_round_check(bits.data_ptr(), bits.numel())
