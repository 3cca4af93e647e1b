"""Glimmer's public names in one place: the model (``models/glimmer.py``), its
config and tensor table (``arch/muse_glimmer.py``), and the shared KV cache and
sampler (``models/parts.py``, ``models/sampling.py``)."""
from __future__ import annotations

from .arch.muse_glimmer import MUSE_GLIMMER, GlimmerConfig
from .arch.spec import expand
from .models.sampling import sample
from .models.glimmer import Glimmer, GlimmerBlock
from .models.parts import KVCache

__all__ = ["Glimmer", "GlimmerConfig", "KVCache", "GlimmerBlock", "gguf_names",
           "module_name", "sample"]


def gguf_names(config: GlimmerConfig) -> dict[str, tuple[int, int]]:
    """Every GGUF tensor of a Glimmer with this config -> its (n_out, n_in), a
    norm as (1, n): Glimmer's table in torch order."""
    out = {}
    for name, (spec, _) in expand(MUSE_GLIMMER, config).items():
        ne = spec.shape(config)
        out[name] = (ne[1], ne[0]) if len(ne) == 2 else (1, ne[0])
    return out


def module_name(gguf_name: str) -> str:
    """``blk.3.attn_q.weight`` -> ``layers.3.attention.wq.weight`` (Glimmer's table)."""
    for spec in MUSE_GLIMMER.tensors:
        if not spec.per_layer and spec.name == gguf_name:
            return spec.module + ".weight"
        if spec.per_layer:
            prefix, suffix = spec.name.split("{i}")
            layer = gguf_name[len(prefix):-len(suffix)] if gguf_name.startswith(prefix) \
                and gguf_name.endswith(suffix) else ""
            if layer.isdigit():
                return spec.module.format(i=int(layer)) + ".weight"
    raise ValueError(f"{gguf_name!r} is not a Glimmer tensor")
