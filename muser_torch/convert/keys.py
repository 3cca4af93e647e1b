"""The metadata of a converted file, key for key and in order as llama.cpp writes it.

The converter (``ModelBase.prepare_metadata`` then ``set_vocab``) adds:
``general.architecture``, ``general.type``, the ``general.*`` naming keys of
gguf-py's ``Metadata`` (name from the directory, size label from the
parameter count, model card facts), the architecture keys ending with
``general.file_type`` (``rules``), ``general.quantization_version``, then
the tokenizer keys (``vocab``). Each is added through a gguf-py ``GGUFWriter``
used as an ordered collector, so the value types are llama.cpp's.

``q4_k_m``, ``q3_k_m``, ``q2_k``, ``iq4_xs``, ``iq4_nl`` and ``mxfp4`` are that F16
file passed through llama-quantize, which re-sets
``general.quantization_version`` and ``general.file_type`` (removing and
appending them, so they move to the end) and appends the
``quantize.imatrix.*`` keys. The Muser lanes add ``muser.weight_precision``.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

from ..arch.muse_glimmer import LANE_KEY
from .checkpoint import Checkpoint
from .imatrix import ImportanceMatrix
from .recipes import FILE_TYPES, FROM_F16, LANES, PlannedTensor
from .rules import Family, common_keys
from .vocab import write_vocab

_QUANTIZE_KEYS = ("general.quantization_version", "general.file_type")


def general_writer(ck: Checkpoint, arch: str, shapes: Sequence[tuple[str, Sequence[int]]],
                   file_kind: str) -> Any:
    """A gguf-py writer holding the ``general.*`` keys llama.cpp's converter
    writes first: the type (``file_kind``, gguf's GGUFType), then the name,
    size label and the rest of ``gguf.Metadata`` of the checkpoint's
    directory, with the parameter count of ``shapes`` (name, ne)."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(path=None, arch=arch)
    for name, ne in shapes:   # shapes only: gguf-py's parameter count reads them
        w.add_tensor_info(name, tuple(reversed(ne)), np.dtype(np.float32), 4 * math.prod(ne),
                          raw_dtype=gguf.GGMLQuantizationType.F32)
    total, shared, expert, n_expert = w.get_total_parameter_count()
    md = gguf.Metadata.load(None, ck.dir, None, total)
    if md.name is None:
        md.name = ck.dir.name
    if md.size_label is None and total > 0:
        md.size_label = gguf.size_label(total, shared, expert, n_expert)
    w.add_type(file_kind)
    md.set_gguf_meta_model(w)
    return w


def collect_metadata(ck: Checkpoint, fam: Family, hp: dict, n_layers: int,
                     plan: Sequence[PlannedTensor], kind: str, pre_tokenizer: str | None,
                     imatrix: ImportanceMatrix | None, vocab_from: "tuple[Path, dict] | None" = None,
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(metadata, value types) for ``save_gguf``. ``vocab_from``: the directory
    and config whose tokenizer the file carries, when not the checkpoint's own
    (a DFlash drafter carries its target's)."""
    import logging

    import gguf

    # The converter re-adds some keys (Gemma 3); gguf-py warns and keeps the
    # first position with the new value, which is what is wanted here.
    logging.getLogger("gguf.gguf_writer").setLevel(logging.ERROR)
    w = general_writer(ck, fam.gguf_arch, [(p.name, p.ne) for p in plan], gguf.GGUFType.MODEL)
    common_keys(w, hp, n_layers)
    # the converter's own file type: llama-quantize's kinds are made from its F16 file
    w.add_file_type(FILE_TYPES["f16" if kind in FROM_F16 else kind])
    fam.keys(w, hp)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    write_vocab(w, *(vocab_from or (ck.dir, hp)), fam.vocab, pre_tokenizer)
    kv = dict(w.kv_data[0])
    if kind in FROM_F16:
        for key in _QUANTIZE_KEYS:
            kv.pop(key)
        kv["general.quantization_version"] = gguf.GGUFValue(gguf.GGML_QUANT_VERSION, gguf.GGUFValueType.UINT32)
        kv["general.file_type"] = gguf.GGUFValue(FILE_TYPES[kind], gguf.GGUFValueType.UINT32)
    if imatrix is not None:
        for key, value, vtype in imatrix.quantize_keys():
            kv[key] = gguf.GGUFValue(value, gguf.GGUFValueType[vtype])
    if kind in LANES:
        kv[LANE_KEY] = gguf.GGUFValue(kind, gguf.GGUFValueType.STRING)
    return _to_save_gguf(kv)


def _to_save_gguf(kv: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """gguf-py's (value, type, sub_type) records as save_gguf's metadata and types;
    an array without an item type takes the type of its first item, as gguf-py does."""
    import gguf
    V = gguf.GGUFValueType
    metadata, types = {}, {}
    for key, rec in kv.items():
        value, vtype = rec.value, V(rec.type)
        if vtype == V.ARRAY:
            items = [v.decode("utf-8") if isinstance(v, (bytes, bytearray)) else v for v in value]
            sub = rec.sub_type if rec.sub_type is not None else V.get_type(value[0])
            metadata[key], types[key] = items, V(sub)
        else:
            if isinstance(value, (bytes, bytearray)):
                value = value.decode("utf-8")
            metadata[key], types[key] = value, vtype
    return metadata, types
