"""GGUF files: a zero-copy reader (``reader``) returning ``records``, a writer
(``writer``), the format's fixed facts, value types and tensor type-id
table (``types``), and the resident pages of the maps the reader makes
(``pages``: released where the CPU runs on a repacked copy).

The names below are the package's public surface; import them from here
(``from muser_torch.gguf_io import load_gguf, SCALE_SUFFIX``).
"""
from __future__ import annotations

from .reader import check_file, load_gguf
from .records import GGUFFile, GGUFTensor
from .types import (DEFAULT_ALIGNMENT, MAGIC, MAX_DIMS, MAX_NAME_BYTES, SCALE2_SUFFIX,
                    SCALE_SUFFIX, VERSIONS, WRITE_VERSION, V, GGUFValueType, block_geometry,
                    type_name)
from .writer import TensorSpec, partial_path, save_gguf

__all__ = ["GGUFFile", "GGUFTensor", "GGUFValueType", "check_file", "load_gguf", "save_gguf", "partial_path",
           "block_geometry", "type_name"]
