"""ModelOpt-style NVFP4 checkpoints, passed through without re-quantizing.

Such a checkpoint stores a quantized linear ``X.weight`` as uint8
``[n_out, n_in/2]`` (two E2M1 codes per byte, element 2i in the low nibble),
``X.weight_scale`` float8_e4m3fn ``[n_out, n_in/16]`` (one scale per 16
inputs of a row) and ``X.weight_scale_2`` float32 (one per tensor), plus an
activation ``X.input_scale`` that weight-only inference does not use. That
is the Muser-native NVFP4 lane bit for bit (docs/muse-glimmer.md): the payload becomes
``X.weight`` of type NVFP4_E2M1 (1000), the scales ``X.weight_scale`` of
F8_E4M3FN (1001), the global scale ``X.weight_scale_2`` of F32, so
``w = e2m1(code) * e4m3(scale) * scale_2`` holds exactly as in the checkpoint.
Row edits of the converter (Llama's q/k permutation) move payload and
scale rows together.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..errors import ConfigMismatchError
from ..formats.types import NVFP4_GROUP
from ..gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX
from .checkpoint import Checkpoint

# checkpoint names beside a packed weight: "X.weight" + these
NVFP4_COMPANIONS = (".weight" + SCALE_SUFFIX, ".weight" + SCALE2_SUFFIX, ".input_scale")


def is_nvfp4_checkpoint(ck: Checkpoint) -> bool:
    return any(packed_source(ck, name) is not None for name in ck.tensors)


@dataclass(frozen=True)
class PackedSource:
    ck: Checkpoint
    hf_name: str
    n_out: int
    n_in: int

    @property
    def shape(self) -> tuple[int, int]:
        """The logical (unpacked) shape of the weight, as config.json implies it."""
        return self.n_out, self.n_in

    def parts(self, gguf_name: str, edit: Callable[[torch.Tensor], torch.Tensor]
              ) -> list[tuple[str, tuple[int, ...], Callable[[], torch.Tensor]]]:
        """(GGUF name, ne, loader) of the payload, its scales and its scale_2."""
        ck, name = self.ck, self.hf_name

        def payload() -> torch.Tensor:
            return edit(ck.load(name)).contiguous()

        def scales() -> torch.Tensor:
            return edit(ck.load(name + SCALE_SUFFIX).view(torch.uint8)).contiguous()

        def scale_2() -> torch.Tensor:
            return ck.load(name + SCALE2_SUFFIX).to(torch.float32).reshape(1)

        return [(gguf_name, (self.n_in, self.n_out), payload),
                (gguf_name + SCALE_SUFFIX, (self.n_in // NVFP4_GROUP, self.n_out), scales),
                (gguf_name + SCALE2_SUFFIX, (1,), scale_2)]


def packed_source(ck: Checkpoint, hf_name: str) -> PackedSource | None:
    """The packed weight ``hf_name`` with its companions checked; None when
    ``hf_name`` is not a packed NVFP4 weight."""
    ref = ck.tensors.get(hf_name)
    if ref is None or ref.dtype != "U8" or not hf_name.endswith(".weight"):
        return None
    scale, scale_2 = ck.tensors.get(hf_name + SCALE_SUFFIX), ck.tensors.get(hf_name + SCALE2_SUFFIX)
    if scale is None and scale_2 is None:
        return None
    if scale is None or scale_2 is None:
        raise ConfigMismatchError(f"NVFP4 weight {hf_name!r} needs both {hf_name + SCALE_SUFFIX!r} "
                                  f"and {hf_name + SCALE2_SUFFIX!r}")
    if len(ref.shape) != 2:
        raise ConfigMismatchError(f"NVFP4 weight {hf_name!r} has shape {list(ref.shape)}, "
                                  f"expected [n_out, n_in / 2]")
    n_out, n_in = ref.shape[0], ref.shape[1] * 2
    if n_in % NVFP4_GROUP:
        raise ConfigMismatchError(f"NVFP4 weight {hf_name!r}: {n_in} inputs are not whole groups "
                                  f"of {NVFP4_GROUP}")
    if scale.dtype != "F8_E4M3" or scale.shape != (n_out, n_in // NVFP4_GROUP):
        raise ConfigMismatchError(f"{hf_name + SCALE_SUFFIX!r} is {scale.dtype} {list(scale.shape)}, "
                                  f"expected F8_E4M3 {[n_out, n_in // NVFP4_GROUP]}")
    if scale_2.dtype != "F32" or len(scale_2.shape) > 1 or (scale_2.shape and scale_2.shape[0] != 1):
        raise ConfigMismatchError(f"{hf_name + SCALE2_SUFFIX!r} is {scale_2.dtype} "
                                  f"{list(scale_2.shape)}, expected one F32 value")
    return PackedSource(ck, hf_name, n_out, n_in)
