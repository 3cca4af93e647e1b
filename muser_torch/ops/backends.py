"""The accelerator backends the ops have loaded, and the questions the model
layer asks them through ``muser_torch.ops`` (``backend``, ``warm_up``), so
that ``models/`` names no backend folder.

``load_backends`` imports ``ops/cuda`` and ``ops/metal`` (which register
their kernels through ``checks.register_kernels``) when the folder exists and
its device is available; ``ops/__init__.py`` calls it once, after the ops are
defined. The CPU's kernels are the ops' default implementations
(``defaults.py``): nothing to load.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import warnings

import torch

__all__ = ["LOADED", "backend", "warm_up", "graph_capture", "layer_step", "load_backends"]

LOADED: dict = {}   # device type -> its loaded kernel module

# device type -> (the backend folder that registers its kernels, whether the device is here)
ACCELERATORS = {"cuda": ("cuda", lambda: torch.cuda.is_available()),
                "mps": ("metal", lambda: torch.backends.mps.is_available())}


def backend(device_type: str):
    """The loaded kernel module of ``device_type`` ('cuda', 'mps'), or None."""
    return LOADED.get(device_type)


def warm_up(model: torch.nn.Module, dtype: torch.dtype, max_tokens: int | None = None) -> float:
    """Ask the backend of each device ``model``'s tensors sit on to prepare the
    kernels its forwards will launch, for ``dtype`` activations and calls of at
    most ``max_tokens`` tokens; returns the seconds it took. A backend that
    compiles nothing at run time (CPU, Metal) defines no ``warm_up``: 0.0."""
    devices = sorted({t.device.type for t in (*model.parameters(), *model.buffers())})
    prepare = [getattr(LOADED.get(d), "warm_up", None) for d in devices]
    return sum(fn(model, dtype, max_tokens=max_tokens) for fn in prepare if fn is not None)


def graph_capture(device_type: str):
    """The backend's ``graphs`` module (``capture(fn, pool)``, ``new_pool()``)
    where steps on ``device_type`` can be recorded once and replayed (CUDA),
    else None: the decode engine then runs its steps eagerly."""
    return getattr(LOADED.get(device_type), "graphs", None)


def layer_step(device_type: str):
    """The backend's runner of whole decoder layers on ``device_type`` (a class
    taking ``models/layer_plan.py``'s plans, the RoPE tables and the longest
    run of one sequence's tokens it is handed, whose
    ``accepts(x)`` says whether a step's activations may take it), or None: the
    CPU library's ``ops/cpu/step.CpuLayers``; CUDA records whole steps instead
    (``graph_capture``), and Metal runs the modules' ops."""
    if device_type == "cpu":
        from .cpu.step import CpuLayers
        return CpuLayers
    return getattr(LOADED.get(device_type), "LayerStep", None)


def load_backends() -> None:
    """Import the backend folder of each available accelerator; a failure
    there never breaks the CPU. An environment variable chooses no backend:
    a set ``MUSER_METAL`` is named, not ignored silently."""
    for name, (folder, is_available) in ACCELERATORS.items():
        try:
            if importlib.util.find_spec(f"{__package__}.{folder}") is None or not is_available():
                continue
            LOADED[name] = importlib.import_module(f"{__package__}.{folder}")
        except Exception as e:  # noqa: BLE001  (a broken backend must not break the package)
            warnings.warn(f"muser_torch: the {name} kernels failed to load ({e!r}); "
                          f"{name} tensors will raise", RuntimeWarning, stacklevel=3)
    if os.environ.get("MUSER_METAL"):
        warnings.warn("muser_torch: MUSER_METAL is not read; choose the Metal emulator with "
                      "muser_torch.ops.use_backend('metal-emulator') (CLI: --backend metal-emulator)",
                      RuntimeWarning, stacklevel=3)
