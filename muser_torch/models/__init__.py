"""The model layer: shared parts (``parts.py``), the shared model base
(``decoder.py``: forward, KV cache; ``generation.py``: sampling, ``stream``,
``generate``; ``assembly.py``: weights from a GGUF through the tensor table)
and one small module per architecture. ``from_gguf`` reads
``general.architecture`` and returns that architecture's model.

Adding an architecture: its facts in ``muser_torch/arch/<name>.py`` (config,
keys, tensor table, fences) and a row in ``arch.ARCHITECTURES``; its block and
model class here, and a row in ``MODELS``."""
from __future__ import annotations

import os

import torch

from ..arch import architecture_of
from ..errors import VisionMismatchError
from ..gguf_io import load_gguf
from ..nn import check_numerics, prepare, set_numerics
from .decoder import Decoder
from .dflash import Drafter
from .gemma3 import Gemma3
from .glimmer import Glimmer
from .llama import Llama, Qwen2, Qwen3

__all__ = ["MODELS", "DRAFTS", "from_gguf", "Decoder", "Drafter", "Gemma3", "Glimmer", "Llama", "Qwen2", "Qwen3"]

MODELS: dict[str, type[Decoder]] = {cls.ARCH.name: cls for cls in (Gemma3, Glimmer, Llama, Qwen2, Qwen3)}
# draft models, which run beside a target (``from_gguf(path, target=model)``)
DRAFTS: dict[str, type[Drafter]] = {Drafter.ARCH.name: Drafter}


def from_gguf(path: str | os.PathLike, device: torch.device | str | None = None,
              dtype: torch.dtype | None = None, progress: bool = False,
              numerics: str = "exact", target: Decoder | None = None,
              mmproj: str | os.PathLike | None = None,
              q5_0_as_q8_0: bool = False) -> "Decoder | Drafter":
    """The model in a GGUF file, of whichever supported architecture it holds
    (a MetadataError names an unsupported one and lists the supported).
    ``dtype`` is the activation dtype: float32 on CPU and the architecture's
    choice on an accelerator when None. ``numerics`` is the projections'
    arithmetic (``nn.NUMERICS``): ``"exact"`` (float activations) or
    ``"ggml"`` (8-bit activations as llama.cpp's CPU backend; CPU only).

    A draft (``dflash``) needs ``target``, the model it drafts for: it is
    built on the target's device and activation dtype (``device`` and ``dtype``
    must be None) and shares its packed embedding and lm_head; a draft without
    a target, or one that does not fit it, is a ``DraftMismatchError``.

    ``mmproj``: llama.cpp's vision projector file beside a Muse Glimmer text
    file (its tower and adapter, packed as the file has them); for another
    architecture, or a projector of another model, a ``VisionMismatchError``.

    ``q5_0_as_q8_0``: every Q5_0 weight becomes Q8_0 of the same values at
    load (the seed's transcode: 55% more bytes for a kernel that reads whole
    bytes). On an H100 it made Gemma 3 270M's CUDA decode 6% faster
    (docs/performance.md; ``bench model --q5-0-as-q8-0`` times it).

    On the CPU the model is ready for its first call (``nn.prepare``): in the
    ggml numerics each weight with a packed kernel is repacked now and its
    pages of the file's map released (``gguf_io/pages.py``; ``progress`` shows
    a bar); the pages of weights run on the file's rows are mapped in."""
    gguf = load_gguf(path)
    name = architecture_of(gguf.metadata, gguf.path.name).name
    if name in DRAFTS:
        if mmproj is not None:
            raise VisionMismatchError("from_gguf: mmproj= is for the target model, not its draft")
        if q5_0_as_q8_0:
            raise ValueError("from_gguf: q5_0_as_q8_0 is for a model's own file; a draft shares "
                             "its target's weights and loads its own as they are")
        # without a target, from_file says that the file is a draft (DraftMismatchError)
        # whatever device or dtype came with it: that is what a caller has to learn first
        if target is not None and (device is not None or dtype is not None):
            raise ValueError("from_gguf: a draft runs on its target's device and dtype; "
                             "pass neither device nor dtype")
        draft = DRAFTS[name].from_file(gguf, target)
        check_numerics(numerics, target.lengths.device if target is not None else None)
        return prepare(set_numerics(draft, numerics), progress)
    if target is not None:
        raise ValueError(f"from_gguf: {gguf.path.name} is a {name!r} model, not a draft; "
                         f"target= is for a draft's file")
    cls = MODELS[name]
    if mmproj is not None and cls is not Glimmer:
        raise VisionMismatchError(f"from_gguf: {gguf.path.name} is a {name!r} model; mmproj= is for "
                                  f"Muse Glimmer ('muse-glimmer') files")
    device = torch.device(device if device is not None else "cpu")
    check_numerics(numerics, device)
    model = cls.from_file(gguf, device, dtype, progress, q5_0_as_q8_0=q5_0_as_q8_0)
    if mmproj is not None:
        model.attach_vision(mmproj)
    # the first call's work done here: repacks (their file pages released), pages mapped
    return prepare(set_numerics(model, numerics), progress)
