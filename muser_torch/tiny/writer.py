"""Writing a synthetic Muse Glimmer GGUF in a Muser lane's recipe (``arch/glimmer_recipe.py``)."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from ..arch.muse_glimmer import GlimmerConfig
from ..formats import GGMLType
from ..formats.types import NVFP4_GROUP
from ..gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX, load_gguf, save_gguf
from ..text.byte_tokenizer import ByteTokenizer
from ..arch.glimmer_recipe import plan, planned_bytes, recipe_weight

__all__ = ["gguf_metadata", "write_tiny"]


def gguf_metadata(config: GlimmerConfig, name: str, tokenizer: dict | None = None) -> dict:
    """A synthetic or demo file's metadata: the config, its tokenizer keys
    (``tokenizer``, when given; else the byte tokenizer when the vocabulary is
    bytes, else ``tokenizer.ggml.model = "none"``, llama.cpp's word for a file
    without a vocabulary, so that llama.cpp runs it too), and ``general.name``."""
    metadata = config.to_metadata()
    if tokenizer is not None:
        metadata |= tokenizer
    elif config.vocab_size == ByteTokenizer.VOCAB_SIZE:
        metadata |= ByteTokenizer().to_metadata()
    else:
        metadata["tokenizer.ggml.model"] = "none"
    metadata["general.name"] = name
    return metadata


def write_tiny(path: str | os.PathLike, config: GlimmerConfig, seed: int = 0,
               progress: bool = False, chunk_bytes: int = 64 << 20, *,
               tokenizer: dict | None = None, tokenizer_types: dict | None = None) -> None:
    """Write a deterministic synthetic Glimmer GGUF without ever holding a whole
    tensor (``tokenizer``: its ``tokenizer.*`` keys, ``tokenizer_types`` their
    GGUF value types where inference would pick another; default: see
    ``gguf_metadata``): ``save_gguf`` lays out the header with every tensor left as a hole
    (a sparse file), then each tensor is drawn in row chunks of about
    ``chunk_bytes`` and written at its offset. The file appears under ``path``
    only once complete."""
    path = Path(path)
    tensors = plan(config)
    layout: dict = {}
    for name, qtype, n_out, n_in in tensors:
        ne = (n_in,) if n_out == 1 else (n_in, n_out)
        layout[name] = (qtype, None, ne)
        if qtype == GGMLType.NVFP4_E2M1:
            layout[name + SCALE_SUFFIX] = (GGMLType.F8_E4M3FN, None, (n_in // NVFP4_GROUP, n_out))
            layout[name + SCALE2_SUFFIX] = (GGMLType.F32, None, (1,))
    tmp = path.with_name(path.name + ".filling")
    save_gguf(tmp, gguf_metadata(config, f"muse-glimmer-tiny-seed{seed}", tokenizer), layout,
              types=tokenizer_types, progress=False)
    try:
        offsets = {n: t.offset for n, t in load_gguf(tmp).tensors.items()}
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=planned_bytes(config)[0], unit="B", unit_scale=True,
                       desc=f"writing {path.name}")
        gen = torch.Generator().manual_seed(seed)
        with open(tmp, "r+b") as f:
            for name, qtype, n_out, n_in in tensors:
                row_bytes = qtype.row_bytes(n_in)
                step = max(1, chunk_bytes // row_bytes)
                for r in range(0, n_out, step):
                    w = recipe_weight(config, name, min(step, n_out - r), n_in, gen, "cpu")
                    f.seek(offsets[name] + r * row_bytes)
                    f.write(w.packed.numpy().tobytes())
                    written = w.packed.numel()
                    if w.has_companions:  # NVFP4 scales, row-aligned with the payload
                        f.seek(offsets[name + SCALE_SUFFIX] + r * (n_in // NVFP4_GROUP))
                        f.write(w.scales.numpy().tobytes())
                        f.seek(offsets[name + SCALE2_SUFFIX])
                        f.write(w.scale_2.numpy().tobytes())
                        written += w.scales.numel() + 4 * (r == 0)
                    if bar is not None:
                        bar.update(written)
        if bar is not None:
            bar.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
