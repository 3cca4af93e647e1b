"""Assembly of a model from packed weights, through its architecture's tensor
table: the module tree is built on the meta device (no float weights), then
each table row's weight is put at the row's module path as its role says:
a norm becomes a float32 parameter, the embedding a ``QEmbedding``, a
projection a ``QLinear``; a tied row absent from the file reuses the tensor
it is tied to (the same bytes: one copy on an accelerator too)."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn as nn

from .. import ops
from ..arch.spec import Role, expand
from ..errors import MetadataError
from ..formats import PackedWeight
from ..gguf_io import GGUFFile
from ..nn import QEmbedding, QLinear
from ..text import tokenizer_from_metadata
from .parts import join_projections

__all__ = ["assemble", "tokenizer_for"]

GetWeight = Callable[[str, int, int], PackedWeight]   # (name, n_out, n_in) -> weight


def assemble(cls: Any, config: Any, groups: frozenset[str], get: GetWeight,
             device: torch.device, dtype: torch.dtype, tokenizer: Any,
             progress: str | None = None) -> Any:
    """A ``cls`` (a ``Decoder``) of ``config`` whose weights come from ``get``."""
    with torch.device("meta"):
        model = cls.build(config, groups)
    rows = expand(cls.ARCH, config, groups)
    names = rows
    if progress is not None:
        from tqdm import tqdm
        names = tqdm(rows, desc=progress, unit="tensor")
    bound: dict[str, PackedWeight] = {}
    for name in names:
        spec, path = rows[name]
        ne = spec.shape(config)
        n_in, n_out = ne[0], (ne[1] if len(ne) > 1 else 1)
        bound[name] = get(name, n_out, n_in).to(device)
        _install(model, path, spec.role, bound[name], device, cls.EMBED_DTYPE or dtype)
    for spec in cls.ARCH.tensors:   # tied rows the file lacks
        if spec.tied_to is not None and spec.name not in rows:
            _install(model, spec.module, spec.role, bound[spec.tied_to], device, dtype)
    model.finish(device, dtype)
    left = [n for n, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta]
    if left:  # admission guarantees every tensor; this guards the wiring itself
        raise RuntimeError(f"{cls.__name__}: no weight was bound to {left}")
    model.tokenizer = tokenizer
    if device.type == "cuda":   # one read of x for q/k/v and gate/up (the weights are copies here)
        join_projections(model)
    # the device's backend prepares every kernel the forward can launch now, not at its first call
    model.warm_up_s = ops.warm_up(model, dtype, max_tokens=getattr(config, "context_length", None))
    return model


def _install(model: nn.Module, path: str, role: Role, w: PackedWeight, device: torch.device,
             embed_dtype: torch.dtype) -> None:
    parent, _, leaf = path.rpartition(".")
    owner = model.get_submodule(parent) if parent else model
    if role is Role.NORM:
        norm = w.dequantize().reshape(w.n_in).to(device, torch.float32)
        getattr(owner, leaf).weight = nn.Parameter(norm, requires_grad=False)
    elif role is Role.BIAS:   # onto the QLinear its table row follows
        bias = w.dequantize().reshape(w.n_in).to(device, torch.float32)
        setattr(owner, leaf, nn.Parameter(bias, requires_grad=False))
    elif role is Role.EMBEDDING:
        setattr(owner, leaf, QEmbedding.from_weight(w, dtype=embed_dtype))
    else:
        setattr(owner, leaf, QLinear.from_weight(w))


def tokenizer_for(gguf: GGUFFile) -> Any:
    """The tokenizer a file carries (``muser_torch.text``): the demo's byte
    tokenizer, llama.cpp's SentencePiece or BPE vocabulary, None for no
    ``tokenizer.ggml.*`` keys; a MetadataError for one it cannot read."""
    try:
        return tokenizer_from_metadata(gguf.metadata)
    except MetadataError as e:
        raise MetadataError(f"{gguf.path.name}: {e}") from None
