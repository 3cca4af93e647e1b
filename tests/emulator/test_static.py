"""The static pass: clang type-checks the project's Metal source with Metal's
address spaces kept apart (g++, and so the emulator, sees one address space).
CI installs clang and sets MUSER_REQUIRE_CLANG=1, so there the pass cannot be
skipped."""
from __future__ import annotations

import os
import re

import pytest

from muser_torch_metal_emulator import static_check
from muser_torch_metal_emulator.emulator import MetalCompileError
from muser_torch.ops import metal

if static_check.clang_path() is None:
    if os.environ.get("MUSER_REQUIRE_CLANG") == "1":
        raise RuntimeError("MUSER_REQUIRE_CLANG=1 but no clang++ is installed (apt-get install clang)")
    pytestmark = pytest.mark.skip(reason="clang is not installed (apt-get install clang)")


def test_the_metal_source_passes_the_address_space_check():
    static_check.check(metal.source())


@pytest.mark.parametrize("old,new,where,why", [
    # a device row handed to a parameter that expects threadgroup memory
    ("inline void load_chunk(device const float *p, thread float *x)",
     "inline void load_chunk(threadgroup const float *p, thread float *x)", r"common\.metal:\d+:\d+",
     "cannot pass pointer to address space '__global' as a pointer to address space '__local'"),
    # a read-only weight pointer where a writable one is declared
    ("template <class F>\ninline void matmul_impl(device const uchar *W",
     "template <class F>\ninline void matmul_impl(device uchar *W", r"kquant\.metal:\d+:\d+",
     "would lose const qualifier"),
])
def test_the_check_sees_address_space_and_const_mistakes(old, new, where, why):
    src = metal.source()
    assert old in src
    with pytest.raises(MetalCompileError, match=where + r": error: no matching function") as info:
        static_check.check(src.replace(old, new))
    assert why in str(info.value)


# What clang reports over llama.cpp's sources (docs/metal.md): Metal language features that C++ for
# OpenCL lacks. An error outside these, an address-space or const mistake above all, fails the test.
LLAMACPP_LANGUAGE_GAPS = [
    r"an attribute list cannot appear here",                              # template [[host_name]] kernel ...
    r"explicit instantiation of .* does not refer to a function template",
    r"duplicate explicit instantiation of",
    r"kernel functions cannot be used in a template declaration",         # kernel templates
    r"variable in constant address space must be initialized",            # function constants
    r"default initialization of an object of const type",
    r"pointers to functions are not allowed",                             # dequantizers as template arguments
    r"too few elements in vector initialization",                         # float4(x)
    r"scalar operand type has greater rank than the type of the vector element",
    r"to vector .* of different size",                                    # float4(half4): a conversion
    r"excess elements in scalar initializer",
    r"unknown type name 'packed_char4'", r"no template named 'is_same'",  # undeclared library names
    r"reference to overloaded function could not be resolved",
]


@pytest.mark.parametrize("kind", ["mul_mv_mma", "mul_mv", "mul_mm"])
def test_the_pass_over_llamacpp_reports_only_language_gaps(kind):
    from ..ops.metal import llamacpp_metal as lm
    src = "".join(f"#define {k} {v}\n" for k, v in lm.MACROS.items()) + lm.library_source(kind)
    errors = static_check.diagnostics(src, f"{kind}.metal")
    assert errors, "clang now takes llama.cpp's source whole: update docs/metal.md and this test"
    other = [e for e in errors if not any(re.search(g, e) for g in LLAMACPP_LANGUAGE_GAPS)]
    assert not other, f"{len(other)} errors outside the known language gaps:\n" + "\n".join(other[:10])
