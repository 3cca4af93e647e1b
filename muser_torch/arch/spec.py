"""How an architecture is described: its metadata keys, each with the range a
model can use, and its tensors, each with a role, a shape in config terms and
the module it becomes. Admission (``loader``), assembly (``models``) and
``make-tiny`` all read these tables; nothing here builds a model.

A tensor row, e.g. ``TensorSpec("blk.{i}.attn_k.weight",
"layers.{i}.attention.wk", PROJECTION, ("hidden", "kv_dim"))``, says: on
every layer i, a projection whose GGUF ``ne`` is ``(cfg.hidden, cfg.kv_dim)``
(``ne`` is GGUF order: ``(n_in, n_out)`` for a matrix), bound to the module
at that path. The rows are written once, by llama.cpp name, in ``names.py``;
an architecture's table lists the names it has. A row with ``group`` is
optional, present on every layer or on none; the model is built with the
groups the file has. A row with ``tied_to`` reuses that tensor when the file
lacks it (a tied lm_head).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Iterable

from ..errors import MetadataError
from ..formats import GGMLType

__all__ = ["Role", "TensorSpec", "Key", "Architecture", "read_keys", "number", "expand", "key_names",
           "INFORMATIONAL_KEYS",
           "describe", "DecoderConfig", "DECODER_KEYS", "LLAMA_CPP_TYPES", "MAX_CONTEXT",
           "MAX_SIZE"]


class Role(Enum):
    EMBEDDING = "embedding"
    PROJECTION = "projection"
    NORM = "norm"
    BIAS = "bias"      # a projection's float bias; its module path names the projection's .bias


# The types llama.cpp's quantization presets write: every one of them runs on the
# CPU, CUDA and Metal qmatmul and embedding kernels.
LLAMA_CPP_TYPES = frozenset({GGMLType.F32, GGMLType.F16, GGMLType.BF16, GGMLType.Q4_0,
                             GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
                             GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                             GGMLType.Q2_K, GGMLType.Q3_K})

# The lookup-table types (formats/iq4.py, formats/mxfp4.py).
LLAMA_CPP_TYPES |= {GGMLType.IQ4_NL, GGMLType.IQ4_XS, GGMLType.MXFP4}
# The 3-bit grid types (formats/iq3.py).
LLAMA_CPP_TYPES |= {GGMLType.IQ3_XXS, GGMLType.IQ3_S}

# Positions are exact in float32 (RoPE angles are position * frequency) up to 2^24.
MAX_CONTEXT = 1 << 24
# Widths, head counts and vocabularies index torch tensors: int32 is plenty.
MAX_SIZE = (1 << 31) - 1


@dataclass(frozen=True)
class TensorSpec:
    name: str                  # GGUF name; "{i}" marks a per-layer tensor
    module: str                # module path in the model, "{i}" the layer
    role: Role
    ne: tuple[str, ...]        # GGUF ne as config attribute names
    group: str | None = None   # optional group: on every layer or on none
    tied_to: str | None = None  # when absent, the module reuses this tensor

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.name

    def shape(self, cfg: Any) -> tuple[int, ...]:
        return tuple(int(getattr(cfg, d)) for d in self.ne)


@dataclass(frozen=True)
class Key:
    """One metadata key ``<arch>.<name>`` -> config field ``field``: an integer
    (or, with ``real``, a float) within ``[lo, hi]``; required unless it has a
    ``default`` (the value llama.cpp fixes for the architecture)."""
    field: str
    name: str
    real: bool = False
    lo: float = 1
    hi: float = MAX_SIZE
    default: float | int | None = None


@dataclass(frozen=True)
class Architecture:
    """An architecture's facts. ``config.from_metadata(md)`` returns its config
    or raises KeyError (a missing key) / ValueError (naming the key). The
    hooks add architecture-specific checks: ``check_metadata(md, where)``
    before the config is read, ``check_tensors(gguf, cfg)`` after every tensor
    passed its fence and shape."""
    name: str                   # general.architecture
    title: str                  # for messages: "a 4-layer Glimmer needs ..."
    config: type
    tensors: tuple[TensorSpec, ...]
    fences: dict[Role, frozenset[GGMLType]]
    groups: dict[str, str] = field(default_factory=dict)   # group -> what it is, for messages
    check_metadata: Callable[[dict, str], None] | None = None
    check_tensors: Callable[[Any, Any], None] | None = None
    # Every ``<name>.*`` key the config reads (names after the prefix): any
    # other key under the prefix may change the math, so it is refused.
    understood: frozenset[str] = frozenset()
    # The Muser-native lanes (``muser.weight_precision``) its files may declare,
    # each with its own fences and checks; () for an architecture whose files
    # are llama.cpp's only (the converter refuses a lane it does not have).
    lanes: tuple[str, ...] = ()

    def check_keys(self, md: dict, where: str) -> None:
        """MetadataError for a ``<name>.*`` key this graph does not follow."""
        prefix = self.name + "."
        unknown = sorted(k for k in md if k.startswith(prefix)
                         and k[len(prefix):] not in self.understood | INFORMATIONAL_KEYS)
        if unknown:
            more = f" (and {len(unknown) - 1} more)" if len(unknown) > 1 else ""
            raise MetadataError(
                f"{where}: {unknown[0]} is set{more}, but muser-torch's {self.title} graph does "
                f"not follow it, and a key it ignored could change the model's math; the "
                f"{prefix}* keys it reads are {', '.join(sorted(self.understood))}")

    def per_layer_required(self) -> int:
        return sum(1 for s in self.tensors if s.per_layer and s.group is None)


# ``<arch>.*`` keys llama.cpp writes that change no computation of a decoder
# generating text: the original checkpoint's layout note, and a flag saying
# the model was fine-tuned with its RoPE scaling (llama.cpp reads, never uses it).
INFORMATIONAL_KEYS = frozenset({"tensor_data_layout", "rope.scaling.finetuned"})


def key_names(*tables: Iterable[Key], extra: Iterable[str] = ()) -> frozenset[str]:
    """The key names (after ``<arch>.``) of these tables, and ``extra``."""
    return frozenset(k.name for t in tables for k in t) | frozenset(extra)


# The keys every decoder here reads the same way (llama.cpp's names), in order.
DECODER_KEYS = (
    Key("context_length", "context_length", hi=MAX_CONTEXT),
    Key("hidden", "embedding_length"),
    Key("ffn", "feed_forward_length"),
    Key("n_layers", "block_count"),
    Key("n_heads", "attention.head_count"),
    Key("n_kv_heads", "attention.head_count_kv"),
    Key("head_dim", "attention.key_length"),
    Key("rms_eps", "attention.layer_norm_rms_epsilon", real=True, lo=1e-12, hi=0.1),
    Key("sliding_window", "attention.sliding_window", hi=MAX_CONTEXT),
)


@dataclass(frozen=True)
class DecoderConfig:
    """The fields ``DECODER_KEYS`` fill, what a decoder derives from them, and
    the checks of values each in range but unusable together. An
    architecture's config subclasses it with its own fields; ``ARCH_NAME``
    prefixes the keys in messages."""
    ARCH_NAME = ""
    context_length: int
    hidden: int
    ffn: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    rms_eps: float
    sliding_window: int

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def is_global(self, layer: int) -> bool:
        """Global (full-context) attention on every ``sliding_window_pattern``-th
        layer (a field of the subclass: where it comes from differs)."""
        return (layer + 1) % self.sliding_window_pattern == 0

    def check(self) -> None:
        """ValueError naming the keys of values that do not fit together."""
        a = self.ARCH_NAME
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"{a}.attention.head_count {self.n_heads} is not a multiple of "
                             f"head_count_kv {self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{a}.attention.key_length {self.head_dim} must be even (RoPE)")
        # A sliding window wider than the context is admitted: it holds every
        # position, as llama.cpp and transformers run it (the converter writes
        # config.json's window as it is), and the cache caps it at the context.


def number(key: str, v: Any, real: bool) -> "int | float":
    """A metadata number, refused (ValueError naming the key) if it is not one:
    no bools, strings or lists, and no fractional, infinite or NaN integers."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{key} is {v!r}, expected {'a number' if real else 'an integer'}")
    if real:
        return float(v)
    if isinstance(v, float) and not v.is_integer():
        raise ValueError(f"{key} is {v!r}, expected an integer")
    return int(v)


def read_keys(md: dict[str, Any], arch: str, keys: Iterable[Key]) -> dict[str, Any]:
    """``{field: value}`` for ``keys`` under ``arch.``; KeyError for a missing
    required key, ValueError (naming it) for a value outside its range."""
    out: dict[str, Any] = {}
    for k in keys:
        key = f"{arch}.{k.name}"
        if key not in md:
            if k.default is None:
                raise KeyError(key)
            out[k.field] = k.default
            continue
        raw = md[key]
        v = number(key, raw, k.real)
        if not k.lo <= v <= k.hi:   # NaN fails too
            lo, hi = (f"{k.lo:g}", f"{k.hi:g}") if k.real else (int(k.lo), int(k.hi))
            what = "a number" if k.real else "an integer"
            raise ValueError(f"{key} is {raw!r}, expected {what} from {lo} to {hi}")
        out[k.field] = v
    return out


def expand(arch: Architecture, cfg: Any, groups: Iterable[str] = ()
           ) -> dict[str, tuple[TensorSpec, str]]:
    """Every tensor of a model of this config with these optional groups, in
    table order (a run of per-layer rows repeats layer by layer) -> (its row,
    its module path). Call only with a layer count bounded by the file."""
    groups = set(groups)
    out: dict[str, tuple[TensorSpec, str]] = {}
    rows = [s for s in arch.tensors if s.group is None or s.group in groups]
    i = 0
    while i < len(rows):
        if not rows[i].per_layer:
            out[rows[i].name] = (rows[i], rows[i].module)
            i += 1
            continue
        j = i
        while j < len(rows) and rows[j].per_layer:
            j += 1
        for il in range(cfg.n_layers):
            for s in rows[i:j]:
                out[s.name.format(i=il)] = (s, s.module.format(i=il))
        i = j
    return out


class _Attrs(dict):
    def __init__(self, cfg: Any):
        super().__init__()
        self.cfg = cfg

    def __missing__(self, key: str) -> Any:
        return getattr(self.cfg, key)


# How a shape dimension reads in an error message, in config terms.
_DIM_TEXT = {
    "hidden": "hidden {hidden}",
    "q_dim": "{n_heads} heads x head_dim {head_dim}",
    "kv_dim": "{n_kv_heads} kv heads x head_dim {head_dim}",
    "ffn": "ffn {ffn}",
    "vocab_size": "vocab_size {vocab_size}",
    "head_dim": "head_dim {head_dim}",
    "fc_in": "{n_taps} tapped layers x hidden {hidden}",
}


def describe(spec: TensorSpec, cfg: Any) -> str:
    """The config values a tensor's shape comes from, for shape errors."""
    attrs = _Attrs(cfg)
    return ", ".join(_DIM_TEXT.get(d, d + " {" + d + "}").format_map(attrs) for d in spec.ne)
