"""``convert``: a Hugging Face checkpoint directory to one GGUF file.

The steps, each in its own module: ``checkpoint`` indexes the safetensors
parts; ``rules`` names and edits the tensors and adds the architecture keys;
``recipes`` picks each tensor's type; ``vocab`` adds the tokenizer keys;
``nvfp4_source`` passes a ModelOpt NVFP4 checkpoint's packed weights through;
``gguf_io.save_gguf`` writes the file atomically, asking for one tensor's
bytes at a time, so memory holds one tensor (in float32 while it is
quantized, in row chunks) plus its output bytes.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..arch import ARCHITECTURES
from ..arch.names import TENSOR_NAMES
from ..errors import (ConfigMismatchError, ConvertError, OutputExistsError, OutputPathError,
                      RecipeError)
from ..formats import GGMLType, quantize
from ..formats.floats import as_float_type
from ..formats.types import NVFP4_GROUP
from ..gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX, partial_path, save_gguf
from .checkpoint import Checkpoint
from .dflash import check_pair, dflash_family, dflash_tensors, is_assistant, mask_key, target_hparams
from .imatrix import load_imatrix
from .keys import collect_metadata
from .mmproj import convert_mmproj
from .nvfp4_source import NVFP4_COMPANIONS, is_nvfp4_checkpoint, packed_source
from .recipes import (FROM_F16, LANES, LLAMA_QUANTIZE, TYPES, PlannedTensor, llama_quantize_order,
                      plan_types)
from .rules import Family, family_of, permute_rows, text_hparams, text_tensor_name

__all__ = ["convert", "ConvertResult"]

_DROP_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")
_FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
_CHUNK_ELEMS = 1 << 22      # floats quantized at once: the K-quant search's temporaries are ~20x
_GPU_CHUNK_ELEMS = 1 << 26  # on a GPU, fewer and larger launches (~5 GB of temporaries)


@dataclass
class ConvertResult:
    path: Path
    tensors: int
    input_bytes: int           # checkpoint tensor bytes read
    output_bytes: int          # GGUF file size
    seconds: float
    skipped: list[str]         # checkpoint tensors left out (a vision tower ...)

    @property
    def gb_per_s(self) -> float:
        return self.input_bytes / self.seconds / 1e9 if self.seconds > 0 else float("inf")


@dataclass
class _Source:
    """One output tensor: its GGUF name, ne, and how to get its float32 (or
    packed) values from the checkpoint."""
    name: str
    ne: tuple[int, ...]
    load: Callable[[], torch.Tensor]
    packed: bool = False        # NVFP4 payload / companion bytes, passed through


def convert(hf_dir: "str | os.PathLike[str]", out: "str | os.PathLike[str]", type: str = "f16", *,
            device: str = "cpu", imatrix: "str | os.PathLike[str] | None" = None,
            pre_tokenizer: str | None = None, progress: bool | None = None,
            force: bool = False, target_model_dir: "str | os.PathLike[str] | None" = None,
            mmproj: bool = False) -> ConvertResult:
    """Convert the checkpoint at ``hf_dir`` into ``out`` (written atomically).

    ``type``: f16, bf16 or q8_0 (llama.cpp's converter), q4_k_m, q3_k_m, q2_k,
    iq4_xs, iq4_nl or mxfp4 (its converter then llama-quantize's Q4_K_M, Q3_K_M,
    Q2_K, IQ4_XS, IQ4_NL, MXFP4_MOE), q4_k_xl or nvfp4 (the Muser lanes, for Muse Glimmer
    only; nvfp4 passes a ModelOpt NVFP4 checkpoint's weights through bit for bit). ``imatrix``:
    llama.cpp's imatrix GGUF for the K-quants. ``pre_tokenizer`` names a BPE
    pre-tokenizer llama.cpp cannot identify by hash. A DFlash drafter
    (``MuseGlimmerAssistantModel``) needs ``target_model_dir``, its target's
    checkpoint, whose vocabulary the file carries. ``mmproj``: Muse Glimmer's vision
    projector file instead of the text model (``convert/mmproj.py``). An existing ``out`` is
    refused before the checkpoint is read (OutputExistsError) unless ``force``;
    then it is replaced only when the new file is complete. Raises ConvertError
    subclasses naming what is wrong; nothing is left at ``out`` then."""
    t0 = time.perf_counter()
    if type not in TYPES:
        raise RecipeError(f"--type {type!r} is not one of {', '.join(TYPES)}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConvertError(f"device {device!r} is not a torch device (cpu, cuda, cuda:N)") from None
    if dev.type not in ("cpu", "cuda"):
        raise ConvertError(f"device {device!r}: the converter quantizes on cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConvertError("--device cuda: no CUDA device is available to this torch")
    out = Path(out)
    check_output(out, force)
    ck = Checkpoint(hf_dir)
    try:
        if mmproj:
            if target_model_dir is not None or imatrix is not None:
                raise ConfigMismatchError("--mmproj takes neither --target-model-dir nor --imatrix")
            n, read = convert_mmproj(ck, out, type, progress)
            return ConvertResult(out, n, read, out.stat().st_size, time.perf_counter() - t0, [])
        if is_assistant(ck.hparams):
            return _convert_dflash(ck, target_model_dir, out, type, dev, pre_tokenizer, progress, t0)
        if target_model_dir is not None:
            raise ConfigMismatchError(f"{ck.dir} is not a DFlash drafter (MuseGlimmerAssistantModel): "
                                      f"--target-model-dir applies only to one")
        return _convert(ck, out, type, dev, imatrix, pre_tokenizer, progress, t0)
    finally:
        ck.close()


def _convert(ck: Checkpoint, out: Path, type: str, dev: torch.device, imatrix: Any,
             pre_tokenizer: str | None, progress: bool | None, t0: float) -> ConvertResult:
    ck.check_weight_map()
    fam = family_of(ck.hparams)
    hp = text_hparams(ck.hparams)
    n_layers = _n_layers(hp)
    fam.check(hp, n_layers)
    nvfp4_ck = is_nvfp4_checkpoint(ck)
    _check_lane(ck, fam, type, nvfp4_ck)
    if nvfp4_ck and type != "nvfp4":
        raise RecipeError(f"{ck.dir}: an NVFP4 checkpoint (packed uint8 weights with E4M3 scales) "
                          f"converts only with --type nvfp4, which keeps its weights as they are; "
                          f"--type {type} would have to dequantize them")
    sources, skipped = _sources(ck, fam, hp, n_layers)
    if type in FROM_F16:      # llama-quantize rewrites the F16 file in its loader's order
        sources.sort(key=lambda s: llama_quantize_order(s.name))
    weights = [s for s in sources if not s.name.endswith(NVFP4_COMPANIONS)]
    heads = hp.get("num_attention_heads", 1)
    plan = plan_types([(s.name, s.ne) for s in weights], type, n_layers,
                      packed=frozenset(s.name for s in weights if s.packed),
                      n_gqa=heads // (hp.get("num_key_value_heads") or heads))
    by_name = {p.name: p for p in plan}
    im = load_imatrix(imatrix) if imatrix is not None else None
    if im is not None and type not in (*LLAMA_QUANTIZE, "q4_k_xl"):
        raise ConvertError(f"--imatrix applies to the K-quant types "
                           f"({', '.join((*LLAMA_QUANTIZE, 'q4_k_xl'))}), not {type}")

    specs: dict[str, tuple] = {}
    for s in sources:
        if s.packed:
            specs[s.name] = _packed_spec(s, by_name.get(s.name))
            continue
        p = by_name[s.name]
        if p.qtype == GGMLType.NVFP4_E2M1:   # quantized here: the companions come with it
            specs.update(_nvfp4_specs(s, dev))
            continue
        importance = im.for_tensor(s.name, s.ne[0]) if im is not None else None
        specs[s.name] = (p.qtype, _producer(s, p, dev, importance), s.ne)
    metadata, types = collect_metadata(ck, fam, hp, n_layers, plan, type, pre_tokenizer, im)
    input_bytes = sum(r.nbytes for r in ck.tensors.values())
    save_gguf(out, metadata, specs, types=types,
              progress=progress if progress is not None else input_bytes >= 64 << 20)
    return ConvertResult(out, len(specs), input_bytes, out.stat().st_size, time.perf_counter() - t0,
                         skipped)


def _convert_dflash(ck: Checkpoint, target_dir: Any, out: Path, type: str, dev: torch.device,
                    pre_tokenizer: str | None, progress: bool | None, t0: float) -> ConvertResult:
    """A DFlash drafter (``convert/dflash.py``): checked against its target,
    its tensors as the checkpoint has them, the target's vocabulary."""
    hp = ck.hparams
    target_dir, target_hp = target_hparams(target_dir)
    check_pair(hp, target_hp)
    fam = dflash_family(target_hp)
    if type in LANES:
        raise RecipeError(f"--type {type} is a Muser lane, which DFlash draft files do not have; "
                          f"a draft takes {', '.join(t for t in TYPES if t not in LANES)}")
    n_layers = hp["num_hidden_layers"]
    rows = dflash_tensors(ck, hp)
    plan = plan_types([(name, ne) for name, _, ne in rows], type, n_layers)
    if type == "q4_k_m":
        plan.sort(key=lambda p: llama_quantize_order(p.name))
    hf_of = {name: hf for name, hf, _ in rows}
    specs = {p.name: (p.qtype, _producer(_Source(p.name, p.ne, lambda n=hf_of[p.name]: _float_source(
        ck.load(n), False)), p, dev, None), p.ne) for p in plan}
    metadata, types = collect_metadata(ck, fam, hp, n_layers, plan, type, pre_tokenizer, None,
                                       vocab_from=(target_dir, text_hparams(target_hp)))
    key, mask, vtype = mask_key(hp)
    metadata[key], types[key] = mask, vtype
    input_bytes = sum(ck.tensors[hf].nbytes for _, hf, _ in rows)
    save_gguf(out, metadata, specs, types=types,
              progress=progress if progress is not None else input_bytes >= 64 << 20)
    return ConvertResult(out, len(specs), input_bytes, out.stat().st_size, time.perf_counter() - t0, [])


def check_output(out: Path, force: bool) -> None:
    """``out`` can take the file: its folder exists, it is not a directory, and
    it is not an existing file unless ``force``. Checked first, so a mistaken
    path costs no time (the file itself is written beside it and renamed).
    Once the path passes, the ``.partial`` a killed run (SIGKILL) left beside
    it is removed: it is never output, and this run would replace it anyway."""
    if out.is_dir():
        raise OutputPathError(f"{out} is a directory; give the path of the GGUF file to write")
    if not out.parent.is_dir():
        raise OutputPathError(f"{out}: the folder {out.parent} does not exist")
    if (out.exists() or out.is_symlink()) and not force:
        raise OutputExistsError(f"{out} exists; pass --force (force=True) to overwrite it")
    partial_path(out).unlink(missing_ok=True)


def _check_lane(ck: Checkpoint, fam: Family, type: str, nvfp4_ck: bool) -> None:
    """A Muser lane only for an architecture whose table has it (a file of
    another one declaring a lane would be refused by ``run``, or carry a lane
    key nothing checks); checked before any tensor is read."""
    arch = ARCHITECTURES[fam.gguf_arch]
    if nvfp4_ck and "nvfp4" not in arch.lanes:
        raise RecipeError(f"{ck.dir}: an NVFP4 checkpoint (packed uint8 weights with E4M3 scales) "
                          f"converts only to the nvfp4 lane, and {arch.title} files have no Muser "
                          f"lane (muser-torch runs them from llama.cpp's types)")
    if type in LANES and type not in arch.lanes:
        takes = ", ".join(t for t in TYPES if t not in LANES or t in arch.lanes)
        raise RecipeError(f"--type {type} is a Muser lane, which {arch.title} files do not have "
                          f"(muser-torch runs them from llama.cpp's types); {arch.title} takes {takes}")


def _n_layers(hp: dict) -> int:
    for k in ("n_layers", "num_hidden_layers", "n_layer", "num_layers"):
        if isinstance(hp.get(k), int):
            return hp[k]
    raise ConfigMismatchError("config.json gives no layer count (num_hidden_layers)")


class _Dims:
    """The config values names.py's shapes are written in, from config.json."""

    def __init__(self, hp: dict):
        heads = hp["num_attention_heads"]
        self.hidden = hp["hidden_size"]
        self.head_dim = hp.get("head_dim") or self.hidden // heads
        self.q_dim = heads * self.head_dim
        self.kv_dim = hp.get("num_key_value_heads", heads) * self.head_dim
        self.ffn = hp["intermediate_size"]
        self.vocab_size = hp["vocab_size"]
        self.rope_pairs = self.head_dim // 2


def _sources(ck: Checkpoint, fam: Family, hp: dict, n_layers: int) -> tuple[list[_Source], list[str]]:
    """The output tensors in the converter's order, each checked against config.json."""
    try:
        dims = _Dims(hp)
    except KeyError as e:
        raise ConfigMismatchError(f"config.json has no {e.args[0]!r}") from None
    out: list[_Source] = []
    for name, t in fam.extra(hp):
        out.append(_Source(name, tuple(reversed(t.shape)), lambda t=t: t))
    skipped: list[str] = []
    trim = _vocab_rows(ck, hp) if fam.trim_embedding else None
    for hf_name, ref in ck.tensors.items():
        name = text_tensor_name(hf_name)
        if name is None:
            skipped.append(hf_name)
            continue
        if name.endswith(_DROP_SUFFIXES) or name.endswith(NVFP4_COMPANIONS):
            continue
        spec = fam.spec(name)
        if spec is None:
            raise ConfigMismatchError(f"tensor {hf_name!r} has no {fam.gguf_arch} GGUF name; "
                                      f"config.json says {hp.get('architectures')}")
        row, layer = spec
        if layer is not None and layer >= n_layers:
            raise ConfigMismatchError(f"tensor {hf_name!r} is in layer {layer}, but config.json "
                                      f"has num_hidden_layers = {n_layers}")
        gguf_name = row.name.format(i=layer)
        packed = packed_source(ck, hf_name)
        if packed is None and ref.dtype not in _FLOAT_DTYPES:
            raise RecipeError(f"tensor {hf_name!r} is {ref.dtype}; the converter takes float weights "
                              f"({', '.join(_FLOAT_DTYPES)}) or ModelOpt NVFP4 (U8 with F8_E4M3 scales)")
        shape = tuple(ref.shape) if packed is None else packed.shape
        want = tuple(reversed(row.shape(dims)))
        if shape != want:
            raise ConfigMismatchError(f"tensor {hf_name!r} has shape {list(shape)}, config.json "
                                      f"implies {list(want)} ({row.name.format(i=layer)})")
        if trim is not None and gguf_name == TENSOR_NAMES["token_embd"].name:
            shape = (min(trim, shape[0]),) + shape[1:]
        ne = tuple(reversed(shape))
        edit = _edit(fam, hp, hf_name, gguf_name, shape)
        if packed is None:
            eager = fam.shifts(gguf_name)
            out.append(_Source(gguf_name, ne,
                               lambda n=hf_name, e=edit, x=eager: e(_float_source(ck.load(n), x))))
        else:
            out.extend(_Source(n, part_ne, load, packed=True) for n, part_ne, load in packed.parts(gguf_name, edit))
        for name2, t in fam.synthesized(hp, gguf_name):
            out.append(_Source(name2, tuple(reversed(t.shape)), lambda t=t: t))
    _check_layers(out, n_layers, fam)
    return out, skipped


def _float_source(t: torch.Tensor, eager: bool) -> torch.Tensor:
    """The converter computes in float16 or float32: any other dtype becomes
    float32 first. bfloat16 is exact in float32, so unless an edit computes on
    the tensor (``eager``: Gemma's +1) it stays bfloat16 here and ``encode``
    widens it chunk by chunk: one float copy of a large tensor is never made."""
    if t.dtype in (torch.float16, torch.float32) or (t.dtype == torch.bfloat16 and not eager):
        return t
    return t.to(torch.float32)


def _edit(fam: Family, hp: dict, hf_name: str, gguf_name: str, shape: tuple[int, ...]
          ) -> Callable[[torch.Tensor], torch.Tensor]:
    """The converter's edits of one tensor (rows of packed bytes too)."""
    steps: list[Callable[[torch.Tensor], torch.Tensor]] = []
    if fam.permute_qk and hf_name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight", "k_proj.bias")):
        heads = hp["num_attention_heads"]
        if ".k_proj." in hf_name:
            heads = hp.get("num_key_value_heads", heads)
        steps.append(lambda t: permute_rows(t, heads))
    if fam.shifts(gguf_name):
        steps.append(lambda t: t + fam.norm_shift)
    if gguf_name == TENSOR_NAMES["token_embd"].name:
        rows = shape[0]
        steps.append(lambda t: t[:rows])

    def apply(t: torch.Tensor) -> torch.Tensor:
        for s in steps:
            t = s(t)
        return t
    return apply


def _vocab_rows(ck: Checkpoint, hp: dict) -> int:
    """Gemma 3: the embedding is cut to the tokenizer's token count."""
    from .vocab import spm_vocab_size, json_vocab_size
    if (ck.dir / "tokenizer.model").is_file():
        return spm_vocab_size(ck.dir, hp)
    return json_vocab_size(ck.dir)


def _check_layers(sources: list[_Source], n_layers: int, fam: Family) -> None:
    """Every layer has the tensors layer 0 has (config and checkpoint agree on depth)."""
    per_layer: dict[int, set[str]] = {}
    for s in sources:
        parts = s.name.split(".")
        if parts[0] == "blk":
            per_layer.setdefault(int(parts[1]), set()).add(".".join(parts[2:]))
    first = per_layer.get(0, set())
    for il in range(n_layers):
        missing = first - per_layer.get(il, set())
        if il not in per_layer or missing:
            raise ConfigMismatchError(f"config.json has {n_layers} layers, but the checkpoint's layer "
                                      f"{il} lacks {sorted(missing or first)[:4]}")


def _producer(s: _Source, p: PlannedTensor, dev: torch.device, weights: torch.Tensor | None
              ) -> Callable[[], Any]:
    def make():
        t = s.load()
        if not bool(torch.isfinite(t).all()):
            raise RecipeError(f"tensor {s.name!r} holds NaN or inf; it cannot be converted")
        return encode(t, p, dev, weights)
    return make


def _nvfp4_specs(s: _Source, dev: torch.device) -> dict[str, tuple]:
    """A 16-bit weight quantized to the nvfp4 lane: the payload's producer
    quantizes the whole tensor (one scale_2 per tensor) and hands the
    companions, written right after it, to theirs."""
    held: dict[str, torch.Tensor] = {}

    def payload() -> torch.Tensor:
        t = s.load()
        if not bool(torch.isfinite(t).all()):
            raise RecipeError(f"tensor {s.name!r} holds NaN or inf; it cannot be converted")
        q, scales, scale_2 = quantize(t.reshape(-1, s.ne[0]).to(device=dev, dtype=torch.float32),
                                      GGMLType.NVFP4_E2M1)
        held["scales"], held["scale_2"] = scales.cpu(), scale_2.reshape(1).cpu()
        return q.cpu()

    n_in, rows = s.ne[0], math.prod(s.ne[1:])
    return {s.name: (GGMLType.NVFP4_E2M1, payload, s.ne),
            s.name + SCALE_SUFFIX: (GGMLType.F8_E4M3FN, lambda: held.pop("scales"), (n_in // NVFP4_GROUP, rows)),
            s.name + SCALE2_SUFFIX: (GGMLType.F32, lambda: held.pop("scale_2"), (1,))}


def encode(t: torch.Tensor, p: PlannedTensor, dev: torch.device,
           weights: torch.Tensor | None = None) -> torch.Tensor:
    """A source tensor (float32, float16 or bfloat16) to the bytes of its planned
    type; quantized types are widened to float32 one chunk of rows at a time."""
    q = p.qtype
    floats = as_float_type(t, q)
    if floats is not None:
        return floats
    rows = t.reshape(-1, p.ne[0])
    out = torch.empty((rows.shape[0], q.row_bytes(p.ne[0])), dtype=torch.uint8)
    step = max(1, (_CHUNK_ELEMS if dev.type == "cpu" else _GPU_CHUNK_ELEMS) // p.ne[0])
    if weights is not None:
        weights = weights.to(dev)
    for r in range(0, rows.shape[0], step):
        chunk = rows[r:r + step]
        if p.source_type == GGMLType.F16:      # llama-quantize reads the F16 file's values
            chunk = chunk.to(torch.float16)
        chunk = chunk.to(device=dev, dtype=torch.float32)
        out[r:r + step] = quantize(chunk, q, imatrix=weights).cpu()
    return out


def _packed_spec(s: _Source, p: PlannedTensor | None) -> tuple:
    """An NVFP4 payload or companion, its bytes as the checkpoint has them."""
    if p is not None and p.qtype != GGMLType.NVFP4_E2M1:
        raise RecipeError(f"tensor {s.name!r} is packed NVFP4 in the checkpoint, but the recipe "
                          f"gives it {p.qtype.name}")
    if s.name.endswith(SCALE_SUFFIX):
        return (GGMLType.F8_E4M3FN, s.load, s.ne)
    if s.name.endswith(SCALE2_SUFFIX):
        return (GGMLType.F32, s.load, s.ne)
    return (GGMLType.NVFP4_E2M1, s.load, s.ne)

