"""Block layouts: every format's fields, declared once, in struct order.

A layout lists a block's fields as (name, bytes, kind); offsets, block sizes,
the constants the C, Triton and Metal kernels are built with, and random
blocks (``formats.random``) are all derived from these declarations, so a
field's position is written down in exactly one place. A format whose scales
live outside the tensor (NVFP4_E2M1) also declares its companions.

Kinds: ``f16``, ``bf16``, ``f32`` (little-endian floats), ``u8`` and ``i8``
(byte arrays: packed codes or sub-block scales), ``ue4m3`` (unsigned E4M3
scale bytes, llama.cpp's NVFP4), ``e4m3`` (E4M3FN bytes), ``e8m0`` (a
power-of-two scale byte, 2**(b - 127): MXFP4).
"""
from __future__ import annotations

from dataclasses import dataclass

QK_K = 256          # elements in a K-quant super-block
K_SCALE_SIZE = 12   # packed 6-bit scales (+ mins) of a Q3_K, Q4_K or Q5_K block
QK_LEGACY = 32      # elements in a Q4_0 .. Q8_0 block
QK_NVFP4 = 64       # elements in a llama.cpp NVFP4 block (4 sub-blocks of 16)
NVFP4_GROUP = 16    # inputs sharing one E4M3 scale (both NVFP4 formats)

QK_MXFP4 = 32       # elements in an MXFP4 block (one E8M0 scale)
QK_IQ4_NL = 32      # elements in an IQ4_NL block
# The 16 values an IQ4_NL / IQ4_XS code indexes (ggml's kvalues_iq4nl); the C
# and Metal kernels get them as MUSER_IQ4_VALUES (c_header).
IQ4_VALUES = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)

FIELD_KINDS = ("f16", "bf16", "f32", "u8", "i8", "ue4m3", "e4m3", "e8m0")


@dataclass(frozen=True)
class Field:
    name: str
    nbytes: int
    kind: str
    offset: int


@dataclass(frozen=True)
class Companion:
    """A tensor stored beside the weight, bound by name suffix: ``per`` weight
    elements share one entry (0: one entry for the whole tensor)."""
    suffix: str
    type_name: str      # a GGMLType name (kept as a string: types.py imports this module)
    per: int


@dataclass(frozen=True)
class Layout:
    block_elems: int
    fields: tuple[Field, ...]
    companions: tuple[Companion, ...] = ()

    @property
    def block_bytes(self) -> int:
        last = self.fields[-1]
        return last.offset + last.nbytes

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no field {name!r} in this layout ({', '.join(f.name for f in self.fields)})")

    def span(self, name: str) -> slice:
        """The byte slice of field ``name`` within a block (for ``blocks[:, span]``)."""
        f = self.field(name)
        return slice(f.offset, f.offset + f.nbytes)


def layout(block_elems: int, *fields: tuple[str, int, str],
           companions: tuple[Companion, ...] = ()) -> Layout:
    """A Layout from (name, bytes, kind) triples in struct order; offsets follow."""
    out, offset = [], 0
    for name, nbytes, kind in fields:
        if kind not in FIELD_KINDS:
            raise ValueError(f"field {name!r}: unknown kind {kind!r}")
        out.append(Field(name, nbytes, kind, offset))
        offset += nbytes
    return Layout(block_elems, tuple(out), companions)


# Keyed by GGMLType name; ``types.GGMLType`` reads its geometry from here.
LAYOUTS: dict[str, Layout] = {
    "F32": layout(1, ("value", 4, "f32")),
    "F16": layout(1, ("value", 2, "f16")),
    "BF16": layout(1, ("value", 2, "bf16")),
    "F8_E4M3FN": layout(1, ("value", 1, "e4m3")),
    "Q4_0": layout(QK_LEGACY, ("d", 2, "f16"), ("qs", QK_LEGACY // 2, "u8")),
    "Q4_1": layout(QK_LEGACY, ("d", 2, "f16"), ("m", 2, "f16"), ("qs", QK_LEGACY // 2, "u8")),
    "Q5_0": layout(QK_LEGACY, ("d", 2, "f16"), ("qh", 4, "u8"), ("qs", QK_LEGACY // 2, "u8")),
    "Q5_1": layout(QK_LEGACY, ("d", 2, "f16"), ("m", 2, "f16"), ("qh", 4, "u8"),
                   ("qs", QK_LEGACY // 2, "u8")),
    "Q8_0": layout(QK_LEGACY, ("d", 2, "f16"), ("qs", QK_LEGACY, "i8")),
    "Q2_K": layout(QK_K, ("scales", QK_K // 16, "u8"), ("qs", QK_K // 4, "u8"), ("d", 2, "f16"),
                   ("dmin", 2, "f16")),
    "Q3_K": layout(QK_K, ("hmask", QK_K // 8, "u8"), ("qs", QK_K // 4, "u8"),
                   ("scales", K_SCALE_SIZE, "u8"), ("d", 2, "f16")),
    "Q4_K": layout(QK_K, ("d", 2, "f16"), ("dmin", 2, "f16"), ("scales", K_SCALE_SIZE, "u8"),
                   ("qs", QK_K // 2, "u8")),
    "Q5_K": layout(QK_K, ("d", 2, "f16"), ("dmin", 2, "f16"), ("scales", K_SCALE_SIZE, "u8"),
                   ("qh", QK_K // 8, "u8"), ("qs", QK_K // 2, "u8")),
    "Q6_K": layout(QK_K, ("ql", QK_K // 2, "u8"), ("qh", QK_K // 4, "u8"),
                   ("scales", QK_K // 16, "i8"), ("d", 2, "f16")),
    "NVFP4": layout(QK_NVFP4, ("d", QK_NVFP4 // NVFP4_GROUP, "ue4m3"), ("qs", QK_NVFP4 // 2, "u8")),
    # The lookup-table types (formats/iq4.py, formats/mxfp4.py): 4-bit codes
    # index a 16-value table; IQ4_XS's scales_h is a little-endian u16.
    "IQ4_NL": layout(QK_IQ4_NL, ("d", 2, "f16"), ("qs", QK_IQ4_NL // 2, "u8")),
    "IQ4_XS": layout(QK_K, ("d", 2, "f16"), ("scales_h", 2, "u8"), ("scales_l", QK_K // 64, "u8"),
                     ("qs", QK_K // 2, "u8")),
    "MXFP4": layout(QK_MXFP4, ("e", 1, "e8m0"), ("qs", QK_MXFP4 // 2, "u8")),
    # The 3-bit grid types (formats/iq3.py): each qs byte indexes a 4-element
    # grid entry (formats/iq_grids.py). IQ3_XXS's scales_signs are eight u32 LE
    # (ggml's qs[64..95]); IQ3_S's qh holds the ninth index bit of each qs byte.
    "IQ3_XXS": layout(QK_K, ("d", 2, "f16"), ("qs", QK_K // 4, "u8"),
                      ("scales_signs", QK_K // 8, "u8")),
    "IQ3_S": layout(QK_K, ("d", 2, "f16"), ("qs", QK_K // 4, "u8"), ("qh", QK_K // 32, "u8"),
                    ("signs", QK_K // 8, "u8"), ("scales", QK_K // 64, "u8")),
    # One scale group of the native payload: 16 codes in 8 bytes. The group's
    # E4M3 scale is a companion tensor, so rows must fill whole groups.
    "NVFP4_E2M1": layout(NVFP4_GROUP, ("qs", NVFP4_GROUP // 2, "u8"),
                         companions=(Companion("_scale", "F8_E4M3FN", NVFP4_GROUP),
                                     Companion("_scale_2", "F32", 0))),
}


def layout_constants(prefix: str = "") -> dict[str, int]:
    """Every derived number the kernels are built with, ``{prefix}{TYPE}_BYTES``,
    ``{prefix}{TYPE}_ELEMS`` and ``{prefix}{TYPE}_{FIELD}`` (the field's byte
    offset), plus the shared block constants. C gets them as a generated header,
    Triton as module constants, Metal as its prelude."""
    out = {f"{prefix}QK_K": QK_K, f"{prefix}K_SCALE_SIZE": K_SCALE_SIZE,
           f"{prefix}QK_LEGACY": QK_LEGACY, f"{prefix}QK_NVFP4": QK_NVFP4,
           f"{prefix}NVFP4_GROUP": NVFP4_GROUP, f"{prefix}QK_MXFP4": QK_MXFP4,
           f"{prefix}QK_IQ4_NL": QK_IQ4_NL}
    for name, lay in LAYOUTS.items():
        out[f"{prefix}{name}_BYTES"] = lay.block_bytes
        out[f"{prefix}{name}_ELEMS"] = lay.block_elems
        for f in lay.fields:
            out[f"{prefix}{name}_{f.name.upper()}"] = f.offset
    return out


def c_header(prefix: str = "MUSER_") -> str:
    """``layout_constants`` as C/MSL ``#define`` lines, and the IQ4 value table,
    the IQ3 grids and their sign table (``iq_grids.py``) as initializer lists."""
    from .iq_grids import IQ3S_GRID, IQ3XXS_GRID, KSIGNS
    lines = ["/* generated from muser_torch/formats/layout.py: do not edit */"]
    lines += [f"#define {k} {v}" for k, v in layout_constants(prefix).items()]
    lines.append(f"#define {prefix}IQ4_VALUES {{{', '.join(map(str, IQ4_VALUES))}}}")
    for name, table in (("IQ3XXS_GRID", IQ3XXS_GRID), ("IQ3S_GRID", IQ3S_GRID)):
        lines.append(f"#define {prefix}{name} {{{', '.join(f'0x{w:08x}u' for w in table)}}}")
    lines.append(f"#define {prefix}KSIGNS {{{', '.join(map(str, KSIGNS))}}}")
    return "\n".join(lines) + "\n"
