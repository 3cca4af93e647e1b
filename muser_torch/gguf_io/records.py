"""The records a parsed GGUF file is made of: ``GGUFTensor`` (one tensor's
type, shape and place, viewing the file's memory map) and ``GGUFFile`` (the
metadata and tensors, with NVFP4 companions and dequantization)."""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from ..errors import CompanionError, UnsupportedTypeError
from ..formats import GGMLType
from ..formats.types import NEEDS_COMPANIONS, NVFP4_GROUP
from ..ops.dequant import dequantize
from .types import SCALE2_SUFFIX, SCALE_SUFFIX, GGUFValueType, _ggml_type, type_name

@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor of a GGUF file. ``ne`` is GGUF's order: ``ne[0]`` is the
    row length (``n_in``); ``n_out`` is the product of the other dimensions
    (1 for a 1-D tensor). ``offset`` is the absolute byte offset in the file;
    ``nbytes`` is None only for a type id whose block geometry is unknown."""

    name: str
    type_id: int
    ne: tuple[int, ...]
    offset: int
    nbytes: int | None
    _buf: np.ndarray | None = field(default=None, repr=False)   # whole-file uint8 view

    @property
    def qtype(self) -> GGMLType | None:
        """The GGMLType, or None for an id this package cannot compute."""
        return _ggml_type(self.type_id)

    @property
    def type_name(self) -> str:
        return type_name(self.type_id)

    @property
    def n_in(self) -> int:
        return self.ne[0] if self.ne else 1

    @property
    def n_out(self) -> int:
        return math.prod(self.ne[1:])

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_out, n_in)``: the matrix view of the tensor."""
        return self.n_out, self.n_in

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def raw(self) -> torch.Tensor:
        """The tensor's bytes, uint8 ``[nbytes]``, viewing the file's memory map.
        Works for every type of known size, computable or not."""
        if self.nbytes is None:
            raise UnsupportedTypeError(
                f"tensor {self.name!r}: type id {self.type_id} has no known block size, "
                f"so its bytes cannot be located")
        if self._buf is None:
            raise UnsupportedTypeError(f"tensor {self.name!r} is not backed by a file")
        view = self._buf[self.offset:self.offset + self.nbytes]
        with warnings.catch_warnings():
            # The map is read-only on purpose (zero copy, shared page cache);
            # torch warns because it has no read-only tensors.
            warnings.filterwarnings("ignore", message=".*not writ", category=UserWarning)
            return torch.from_numpy(view)

    @property
    def packed(self) -> torch.Tensor:
        """uint8 ``[n_out, row_bytes]``: the rows as the block formats expect them."""
        qtype = self.require_qtype()
        return self.raw.view(self.n_out, qtype.row_bytes(self.n_in))

    def require_qtype(self) -> GGMLType:
        qtype = self.qtype
        if qtype is None:
            raise UnsupportedTypeError(
                f"tensor {self.name!r} has type {self.type_name} (id {self.type_id}), "
                f"which muser-torch cannot compute; supported: "
                f"{', '.join(t.name for t in GGMLType)}")
        return qtype


class GGUFFile:
    """A parsed GGUF file. ``metadata`` maps keys to Python values (lists for
    arrays); ``metadata_types`` gives each key's GGUF value type (the item
    type for arrays), so ``save_gguf(p, f.metadata, f.tensors,
    types=f.metadata_types)`` writes the same header back. A split model
    (``gguf_io.split``) is one ``GGUFFile`` over all its ``parts``: ``path``
    is the first part's, and each tensor views its own part's map."""

    def __init__(self, path: Path, version: int, alignment: int, data_offset: int,
                 file_size: int, metadata: dict[str, Any],
                 metadata_types: dict[str, GGUFValueType],
                 tensors: dict[str, GGUFTensor], parts: tuple[Path, ...] | None = None) -> None:
        self.path = path
        self.parts = parts if parts is not None else (path,)
        self.version = version
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = file_size
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors

    def __repr__(self) -> str:
        split = f", {len(self.parts)} parts" if len(self.parts) > 1 else ""
        return (f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors{split})")

    def __getitem__(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"{self.path.name}: no tensor named {name!r}") from None

    def companions(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The NVFP4_E2M1 companions of tensor ``name`` (``X.weight``):
        ``X.weight_scale`` as float8_e4m3fn ``[n_out, n_in/16]`` and
        ``X.weight_scale_2`` as a float32 scalar. Raises CompanionError."""
        t = self[name]
        scale_name, scale2_name = name + SCALE_SUFFIX, name + SCALE2_SUFFIX
        sc = self.tensors.get(scale_name)
        s2 = self.tensors.get(scale2_name)
        if sc is None or s2 is None:
            missing = [n for n, x in ((scale_name, sc), (scale2_name, s2)) if x is None]
            raise CompanionError(
                f"tensor {name!r} is NVFP4_E2M1 but its companion(s) {', '.join(missing)} "
                f"are missing; expected {scale_name} (F8_E4M3FN) and {scale2_name} (F32)")
        want = (t.n_out, t.n_in // NVFP4_GROUP)
        if sc.type_id != GGMLType.F8_E4M3FN or sc.shape != (want[0], want[1]):
            raise CompanionError(
                f"companion {scale_name!r}: found {sc.type_name} with (n_out, n_in) "
                f"{sc.shape}, expected F8_E4M3FN {want} (one scale per {NVFP4_GROUP} "
                f"inputs of {name!r})")
        if s2.type_id != GGMLType.F32 or s2.n_elements != 1:
            raise CompanionError(
                f"companion {scale2_name!r}: found {s2.type_name} with {s2.n_elements} "
                f"elements (ne {list(s2.ne)}), expected one F32 value")
        scales = sc.packed.view(torch.float8_e4m3fn)
        scale_2 = s2.raw.view(torch.float32).reshape(())
        return scales, scale_2

    def dequantize(self, name: str, rows: "slice | Sequence[int] | torch.Tensor | None" = None
                   ) -> torch.Tensor:
        """float32 ``[n_out, n_in]`` values of tensor ``name`` (or of the selected
        ``rows``), NVFP4_E2M1 companions included. Only the rows asked for are read."""
        t = self[name]
        qtype = t.require_qtype()
        packed = t.packed
        scales = scale_2 = None
        if qtype in NEEDS_COMPANIONS:
            scales, scale_2 = self.companions(name)
        if rows is not None:
            index = rows if isinstance(rows, slice) else torch.as_tensor(rows, dtype=torch.long)
            packed = packed[index].contiguous()
            if scales is not None:
                scales = scales[index].contiguous()
        return dequantize(packed, qtype, t.n_in, scales=scales, scale_2=scale_2)

    @property
    def tensor_bytes(self) -> int:
        """Bytes of all tensors of known size."""
        return sum(t.nbytes for t in self.tensors.values() if t.nbytes is not None)
