"""Split GGUF files written by gguf-py's own writer (``split_max_tensors``):
the layout llama.cpp's ``gguf-split`` produces."""
from __future__ import annotations

from pathlib import Path

from gguf import GGUFWriter
from gguf.constants import GGMLQuantizationType, GGUFValueType

from muser_torch import load_gguf
from muser_torch.gguf_io.split import part_path


def split_with_gguf_py(whole_path: Path, prefix: Path, tensors_per_part: int) -> list[Path]:
    """The file at ``whole_path`` rewritten by gguf-py's writer as parts of at
    most ``tensors_per_part`` tensors; returns the part paths in order."""
    whole = load_gguf(whole_path)
    writer = GGUFWriter(prefix.with_suffix(".gguf"), whole.metadata["general.architecture"],
                        split_max_tensors=tensors_per_part)
    for key, value in whole.metadata.items():
        if key in ("general.architecture", "general.alignment"):
            continue
        vtype = whole.metadata_types[key]
        if isinstance(value, list):
            writer.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=vtype)
        else:
            writer.add_key_value(key, value, vtype)
    for name, t in whole.tensors.items():
        rows = t.raw.numpy().reshape(*reversed(t.ne[1:]), -1)   # gguf-py takes byte shapes
        writer.add_tensor(name, rows, raw_dtype=GGMLQuantizationType(t.type_id))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    count = -(-len(whole.tensors) // tensors_per_part)
    return [part_path(prefix, i, count) for i in range(count)]
