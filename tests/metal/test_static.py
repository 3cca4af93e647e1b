"""The static pass: clang type-checks the project's Metal source with Metal's
address spaces kept apart (g++, and so the emulator, sees one address space).
CI installs clang and sets MUSER_REQUIRE_CLANG=1, so there the pass cannot be
skipped."""
from __future__ import annotations

import os

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
