"""Shared helpers for the op tests: fresh random packed weights each run (the
seed goes into every assertion message) and the float64 reference."""
from __future__ import annotations

import contextlib
import platform
import random

import pytest
import torch

from muser_torch.formats import dequantize_reference as ref_dequantize
from muser_torch.formats import random_weight
from muser_torch.formats.types import GGMLType
from muser_torch.ops import cpu

# Every type the format registry computes.
ALL_TYPES = [t for t in GGMLType]
# The types the native CPU library runs (the rest always take the torch path):
# cpu.NATIVE_TYPES, the set its dispatch reads, in id order.
NATIVE_TYPES = sorted(cpu.NATIVE_TYPES)


class Case:
    """A random weight of one type: ``args`` are the op's weight arguments."""

    def __init__(self, qtype: GGMLType, n_out: int, blocks: int, seed: int | None = None):
        self.seed = random.randrange(1 << 31) if seed is None else seed
        self.gen = torch.Generator().manual_seed(self.seed)
        self.qtype, self.n_out = qtype, n_out
        self.n_in = blocks * max(qtype.block_elems, 16)
        self.weight = random_weight(qtype, n_out, self.n_in, generator=self.gen)
        self.packed, self.scales, self.scale_2 = (self.weight.packed, self.weight.scales,
                                                  self.weight.scale_2)

    @property
    def args(self):
        return self.weight.op_args()

    def weight64(self) -> torch.Tensor:
        w = ref_dequantize(self.packed, self.qtype, self.n_in, scales=self.scales,
                           scale_2=self.scale_2)
        return w.double()

    def randn(self, *shape, dtype=torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=self.gen).to(dtype)

    def __str__(self) -> str:
        return f"{self.qtype.name} [{self.n_out}, {self.n_in}] seed {self.seed}"


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.double() - ref).norm() / ref.norm())


@pytest.fixture(params=["native", "torch"])
def cpu_path(request):
    """Run a test under each CPU path (the native one must be available here)."""
    if request.param == "native":
        assert cpu.native_available(), "the native CPU kernels failed to build"
    with cpu.use_native(request.param == "native"):
        yield request.param


# The other builds an x86-64 machine can run: (-march, the cpuinfo flags it needs).
OTHER_MARCHES = [("haswell", ("avx2", "fma")), ("x86-64", ())]
x86_only = pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                              reason="x86-64 builds only")


def _cpu_flags() -> str:
    try:
        return open("/proc/cpuinfo").read()
    except OSError:
        return ""


@contextlib.contextmanager
def native_build_for(march: str, needs: tuple[str, ...], monkeypatch):
    """Within the block the native library is the -march=``march`` build
    (skips the test when this CPU lacks ``needs``); the default one after."""
    if any(f" {n}" not in _cpu_flags() for n in needs):
        pytest.skip(f"this CPU lacks {needs}")
    monkeypatch.setenv("MUSER_CPU_MARCH", march)
    cpu._native_lib.cache_clear()
    try:
        assert cpu.native_available(), f"no native build for -march={march}"
        yield
    finally:
        monkeypatch.delenv("MUSER_CPU_MARCH")
        cpu._native_lib.cache_clear()
