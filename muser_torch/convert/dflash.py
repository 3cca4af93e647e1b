"""A DFlash drafter (transformers' ``MuseGlimmerAssistantModel``) to a
``dflash`` GGUF, as llama.cpp's ``convert_hf_to_gguf.py ASSISTANT
--target-model-dir TARGET`` writes it and ``arch/dflash.py`` reads it.

The drafter has no embedding and no lm_head: it shares its target's. So the
file takes its vocabulary (the ``tokenizer.*`` keys) from the target's
directory, and the conversion checks the pair before any tensor is read:
the hidden sizes agree, every tapped layer exists in the target, the mask
token is inside the target's vocabulary.

Keys: the decoder keys every converted file has (``rules.common_keys``),
then ``block_size``, ``target_layers`` = ``target_layer_ids`` + 1 (llama.cpp
records the tapped layer's *input*), the window and its bool-per-layer
pattern, then the target's tokenizer and the mask token. Tensors are
``arch/dflash.py``'s ``HF_NAMES`` rows, written as the checkpoint has them:
q/k keep their rotate-half order, norms are plain ``w``, q/k norms learned.
"""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..arch.dflash import ARCH, HF_NAMES, MASK_KEY
from ..arch.names import TENSOR_NAMES
from ..errors import CheckpointError, ConfigMismatchError, RecipeError
from .checkpoint import Checkpoint, load_hparams
from .rules import Family, family_of, text_hparams

__all__ = ["ASSISTANT_ARCHS", "is_assistant", "dflash_family", "dflash_tensors", "check_pair"]

ASSISTANT_ARCHS = ("MuseGlimmerAssistantModel",)

# GGUF name pattern -> names.py row, for the shapes
_ROWS = {spec.name: spec for spec in TENSOR_NAMES.values()}


def is_assistant(hp: dict) -> bool:
    """Whether config.json is a DFlash drafter's."""
    archs = hp.get("architectures") or []
    return bool(archs) and archs[0] in ASSISTANT_ARCHS


def _keys(w: Any, hp: dict) -> None:
    """The dflash keys after the common ones (``general.file_type`` among them)."""
    w.add_uint32(f"{ARCH}.block_size", int(hp["block_size"]))
    w.add_array(f"{ARCH}.target_layers", [int(i) + 1 for i in hp["target_layer_ids"]])
    pattern = [t == "sliding_attention" for t in _layer_types(hp)]
    if any(pattern) and hp.get("sliding_window"):
        w.add_sliding_window(int(hp["sliding_window"]))
        w.add_sliding_window_pattern(pattern)


def _layer_types(hp: dict) -> list[str]:
    types = hp.get("layer_types") or ["sliding_attention"] * hp["num_hidden_layers"]
    if len(types) != hp["num_hidden_layers"]:
        raise ConfigMismatchError(f"config.json's layer_types has {len(types)} entries for "
                                  f"num_hidden_layers = {hp['num_hidden_layers']}")
    return list(types)


def dflash_family(target_hp: dict) -> Family:
    """The converter class of a drafter whose vocabulary is its target's
    (``target_hp``: the target's config.json)."""
    return Family(ARCH, ASSISTANT_ARCHS, {}, family_of(target_hp).vocab, _keys)


def target_hparams(target_dir: "str | os.PathLike[str] | None") -> tuple[Path, dict]:
    """The target's directory and its config.json (as ``load_hparams`` reads it)."""
    if target_dir is None:
        raise ConfigMismatchError("a DFlash drafter (MuseGlimmerAssistantModel) has no vocabulary of its "
                                  "own: give its target's checkpoint directory (--target-model-dir)")
    d = Path(target_dir)
    if not d.is_dir():
        raise CheckpointError(f"--target-model-dir {d}: not a directory (expected the target's checkpoint)")
    return d, load_hparams(d)


def check_pair(hp: dict, target_config: dict) -> None:
    """ConfigMismatchError naming the first value of the drafter that does not
    fit the target: hidden size, tapped layers, mask token, block size."""
    target_hp = text_hparams(target_config)
    for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
              "block_size", "mask_token_id", "target_layer_ids"):
        if k not in hp:
            raise ConfigMismatchError(f"the drafter's config.json has no {k!r}")
    name = (target_config.get("architectures") or ["the target"])[0]
    if hp["hidden_size"] != target_hp.get("hidden_size"):
        raise ConfigMismatchError(f"the drafter's hidden_size is {hp['hidden_size']}, the target's "
                                  f"({name}) is {target_hp.get('hidden_size')}: "
                                  f"it drafts for another model")
    n_target = target_hp.get("num_hidden_layers")
    taps = list(hp["target_layer_ids"])
    if not taps or not all(isinstance(i, int) and 0 <= i < (n_target or 0) for i in taps):
        raise ConfigMismatchError(f"the drafter's target_layer_ids {taps} are not all layers of the "
                                  f"target's {n_target}")
    vocab = target_hp.get("vocab_size")
    if not isinstance(vocab, int) or not 0 <= hp["mask_token_id"] < vocab:
        raise ConfigMismatchError(f"the drafter's mask_token_id {hp['mask_token_id']} is outside the "
                                  f"target's vocabulary of {vocab} tokens: it drafts for another model")
    if int(hp["block_size"]) < 2:
        raise ConfigMismatchError(f"the drafter's block_size is {hp['block_size']}; a block holds the "
                                  f"last token and at least one mask")


def dflash_tensors(ck: Checkpoint, hp: dict) -> list[tuple[str, str, tuple[int, ...]]]:
    """(GGUF name, checkpoint name, ne) of every tensor in file order, each
    checked against config.json; a checkpoint tensor of no row is refused."""
    n_layers = hp["num_hidden_layers"]
    head_dim = hp.get("head_dim") or hp["hidden_size"] // hp["num_attention_heads"]
    dims = SimpleNamespace(hidden=hp["hidden_size"], head_dim=head_dim, ffn=hp["intermediate_size"],
                           q_dim=hp["num_attention_heads"] * head_dim,
                           kv_dim=hp.get("num_key_value_heads", hp["num_attention_heads"]) * head_dim,
                           fc_in=len(hp["target_layer_ids"]) * hp["hidden_size"])
    out, used = [], set()
    for gguf_pat, hf_pat in HF_NAMES.items():
        for i in (range(n_layers) if "{i}" in gguf_pat else [None]):
            hf_name, gguf_name = hf_pat.format(i=i), gguf_pat.format(i=i)
            ref = ck.tensors.get(hf_name)
            if ref is None:
                raise ConfigMismatchError(f"{ck.dir}: the checkpoint lacks {hf_name!r} ({gguf_name})")
            want = tuple(reversed(_ROWS[gguf_pat].shape(dims)))
            if tuple(ref.shape) != want:
                raise ConfigMismatchError(f"tensor {hf_name!r} has shape {list(ref.shape)}, config.json "
                                          f"implies {list(want)} ({gguf_name})")
            if ref.dtype not in ("F32", "F16", "BF16", "F64"):
                raise RecipeError(f"tensor {hf_name!r} is {ref.dtype}; the converter takes float weights")
            out.append((gguf_name, hf_name, tuple(reversed(ref.shape))))
            used.add(hf_name)
    extra = [n for n in ck.tensors if n not in used and not n.endswith("inv_freq")]
    if extra:
        raise ConfigMismatchError(f"tensor {extra[0]!r} has no {ARCH} GGUF name "
                                  f"({len(extra)} such tensors)")
    # llama.cpp's converter writes a drafter's tensors in the checkpoint's order
    order = {name: i for i, name in enumerate(ck.tensors)}
    return sorted(out, key=lambda row: order[row[1]])


def mask_key(hp: dict) -> tuple[str, int, Any]:
    """The mask token's key, value and gguf-py value type, written after the
    target's tokenizer keys (so it wins over any mask token the target has)."""
    import gguf
    return MASK_KEY, int(hp["mask_token_id"]), gguf.GGUFValueType.UINT32
