"""A process-wide count of changes to modules: every registration of a
parameter, buffer or submodule (which ``torch.nn.Module.__setattr__`` makes on
every assignment of one), every ``_apply`` (``.to()``, ``.half()``,
``.float()``: they replace tensors without registering them) of the modules
that hold the packed models' tensors, and every change of a ``QLinear``'s
numerics.

What caches data pointers into a model (``models/layer_plan.py``'s runners) keeps the
count it was built at and is rebuilt when the count has moved: one integer
compare per step instead of re-reading every tensor. A change this does not
see (``tensor.data = other``, ``tensor.set_(...)``) leaves such a cache
stale; it keeps the storages it points at alive, so it reads the old values,
never freed memory."""
from __future__ import annotations

from torch.nn.modules import module as _module

__all__ = ["count", "bump"]

_count = 0


def count() -> int:
    """The number of changes seen so far."""
    return _count


def bump(*_args) -> None:
    """Count one change (also the registration hooks: returns None, so the
    registered value is kept)."""
    global _count
    _count += 1


_module.register_module_parameter_registration_hook(bump)
_module.register_module_buffer_registration_hook(bump)
_module.register_module_module_registration_hook(bump)
