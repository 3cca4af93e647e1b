"""Fail-closed admission of a Glimmer GGUF, and binding of its packed weights.

``admit`` runs every check of GLIMMER.md before any weight is used and
returns the config; each refusal is an ``AdmissionError`` subclass whose
message names the tensor (or key), what was found and what was expected.
The checks, in order:

1. lane: ``muser.weight_precision`` is present and one of ``LANES``;
2. metadata: the config keys are present and sane;
3. tensor set: exactly the tensors the config implies (per-head q/k norms
   on every layer or none; NVFP4 companions only beside NVFP4 tensors);
4. per tensor, in file order: the dtype fence of its role, then its shape;
5. the lane against the tensors: ``q4_k_xl`` has no NVFP4 tensor, ``nvfp4``
   has at least one and every one has its companions bound.

Nothing is converted: a tensor of a type outside its fence is refused, not
dequantized and re-packed.
"""
from __future__ import annotations

import math
from enum import Enum

from .config import ARCH, LANE_KEY, LANES, GlimmerConfig
from .errors import (CompanionError, DtypeFenceError, LaneError, MetadataError,
                     ShapeMismatchError, TensorSetError)
from .formats import GGMLType, PackedWeight
from .formats.types import NEEDS_COMPANIONS
from .gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX, GGUFFile, GGUFTensor

__all__ = ["admit", "expected_tensors", "Role", "PackedWeight", "packed_weight", "bind_weights"]


class Role(Enum):
    EMBEDDING = "embedding"
    PROJECTION = "projection"
    NORM = "norm"


# The dtype fences (GLIMMER.md, "Weight types and fail-closed admission").
FENCES: dict[Role, frozenset[GGMLType]] = {
    Role.PROJECTION: frozenset({GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K,
                                GGMLType.NVFP4_E2M1, GGMLType.F16}),
    Role.EMBEDDING: frozenset({GGMLType.Q4_K, GGMLType.F16}),
    Role.NORM: frozenset({GGMLType.F32}),
}


def expected_tensors(cfg: GlimmerConfig, qk_norm: bool = False
                     ) -> dict[str, tuple[Role, tuple[int, ...]]]:
    """Every tensor a Glimmer of this config has -> (role, GGUF ``ne``).

    ``ne`` is GGUF order, ``(n_in, n_out)`` for a matrix. The lm_head
    (``output.weight``) is a projection: it is untied and fenced like one."""
    h, q, kv, ffn = cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.ffn
    P, N = Role.PROJECTION, Role.NORM
    out: dict[str, tuple[Role, tuple[int, ...]]] = {
        "token_embd.weight": (Role.EMBEDDING, (h, cfg.vocab_size))}
    per_layer = {"attn_norm": (N, (h,)), "attn_q": (P, (h, q)), "attn_gate": (P, (h, q)),
                 "attn_k": (P, (h, kv)), "attn_v": (P, (h, kv)), "attn_output": (P, (q, h)),
                 "ffn_norm": (N, (h,)), "ffn_gate": (P, (h, ffn)), "ffn_up": (P, (h, ffn)),
                 "ffn_down": (P, (ffn, h))}
    if qk_norm:
        per_layer |= {"attn_q_norm": (N, (cfg.head_dim,)), "attn_k_norm": (N, (cfg.head_dim,))}
    for il in range(cfg.n_layers):
        for k, v in per_layer.items():
            out[f"blk.{il}.{k}.weight"] = v
    out["output_norm.weight"] = (N, (h,))
    out["output.weight"] = (P, (h, cfg.vocab_size))
    return out


def admit(gguf: GGUFFile) -> GlimmerConfig:
    """Check a parsed file against GLIMMER.md; return its config or raise."""
    where = gguf.path.name
    lane = _lane(gguf.metadata, where)
    cfg = _config(gguf.metadata, where)
    qk_norm = _qk_norm(gguf, cfg)
    expected = expected_tensors(cfg, qk_norm)

    companions = {n for n in gguf.tensors if _companion_parent(n) is not None}
    missing = [n for n in expected if n not in gguf.tensors]
    if missing:
        raise TensorSetError(
            f"{where}: missing tensor {missing[0]!r}" +
            (f" and {len(missing) - 1} more" if len(missing) > 1 else "") +
            f" (a {cfg.n_layers}-layer Glimmer needs {len(expected)} tensors)")
    unexpected = [n for n in gguf.tensors if n not in expected and n not in companions]
    if unexpected:
        raise TensorSetError(f"{where}: unexpected tensor {unexpected[0]!r}"
                             + (f" and {len(unexpected) - 1} more" if len(unexpected) > 1 else "")
                             + "; Glimmer does not use it")

    for name, t in gguf.tensors.items():
        if name in companions:
            continue
        role, ne = expected[name]
        _fence(t, role)
        if t.ne != ne:
            raise ShapeMismatchError(
                f"tensor {name!r}: ne {list(t.ne)} but the config expects {list(ne)} "
                f"({_describe(name, cfg)})")

    nvfp4 = [n for n, t in gguf.tensors.items() if t.type_id == GGMLType.NVFP4_E2M1]
    for name in sorted(companions, key=lambda n: gguf.tensors[n].offset):
        parent = _companion_parent(name)
        pt = gguf.tensors.get(parent)
        if pt is None or pt.type_id != GGMLType.NVFP4_E2M1:
            found = "no such tensor" if pt is None else pt.type_name
            raise CompanionError(f"tensor {name!r} is an NVFP4 companion, but {parent!r} is "
                                 f"{found}, expected NVFP4_E2M1")
    if lane == "q4_k_xl" and nvfp4:
        raise LaneError(f"{where}: {LANE_KEY} is 'q4_k_xl' but tensor {nvfp4[0]!r} is "
                        f"NVFP4_E2M1 ({len(nvfp4)} NVFP4 tensors); the kquant lane admits none")
    if lane == "nvfp4":
        if not nvfp4:
            raise LaneError(f"{where}: {LANE_KEY} is 'nvfp4' but no tensor is NVFP4_E2M1")
        for name in nvfp4:
            gguf.companions(name)   # raises CompanionError naming what is wrong
    return cfg


def _lane(md: dict, where: str) -> str:
    if LANE_KEY not in md:
        raise LaneError(f"{where}: metadata key {LANE_KEY!r} is missing; it is required and "
                        f"must be one of {', '.join(map(repr, LANES))}")
    lane = md[LANE_KEY]
    if lane not in LANES:
        raise LaneError(f"{where}: {LANE_KEY} is {lane!r}, expected one of "
                        f"{', '.join(map(repr, LANES))}")
    return lane


def _config(md: dict, where: str) -> GlimmerConfig:
    try:
        cfg = GlimmerConfig.from_metadata(md)
    except KeyError as e:
        raise MetadataError(f"{where}: metadata key {e.args[0]!r} is missing "
                            f"(required for general.architecture {ARCH!r})") from None
    except (ValueError, OverflowError) as e:   # a bad value, or float() of a huge int
        raise MetadataError(f"{where}: {e}") from None
    sizes = {"embedding_length": cfg.hidden, "feed_forward_length": cfg.ffn,
             "block_count": cfg.n_layers, "attention.head_count": cfg.n_heads,
             "attention.head_count_kv": cfg.n_kv_heads, "attention.key_length": cfg.head_dim,
             "vocab_size": cfg.vocab_size, "context_length": cfg.context_length,
             "attention.sliding_window": cfg.sliding_window,
             "attention.sliding_window_pattern": cfg.sliding_window_pattern}
    for key, v in sizes.items():
        if v <= 0:
            raise MetadataError(f"{where}: {ARCH}.{key} is {v}, expected a positive integer")
    if cfg.n_heads % cfg.n_kv_heads:
        raise MetadataError(f"{where}: {ARCH}.attention.head_count {cfg.n_heads} is not a "
                            f"multiple of head_count_kv {cfg.n_kv_heads}")
    if cfg.head_dim % 2:
        raise MetadataError(f"{where}: {ARCH}.attention.key_length {cfg.head_dim} must be even (RoPE)")
    if not (math.isfinite(cfg.rms_eps) and cfg.rms_eps > 0 and math.isfinite(cfg.rope_base)
            and cfg.rope_base > 0):
        raise MetadataError(f"{where}: rms epsilon {cfg.rms_eps} and rope.freq_base "
                            f"{cfg.rope_base} must be positive and finite")
    return cfg


def _qk_norm(gguf: GGUFFile, cfg: GlimmerConfig) -> bool:
    """Per-head q/k norms are optional, but on every layer or on none."""
    have = [f"blk.{il}.attn_{w}_norm.weight" in gguf.tensors
            for il in range(cfg.n_layers) for w in "qk"]
    if any(have) and not all(have):
        il, w = divmod(have.index(False), 2)
        raise TensorSetError(f"{gguf.path.name}: per-head q/k norms are present on some layers "
                             f"but tensor 'blk.{il}.attn_{'qk'[w]}_norm.weight' is missing")
    return all(have)


def _companion_parent(name: str) -> str | None:
    for suffix in (SCALE_SUFFIX, SCALE2_SUFFIX):
        if name.endswith(".weight" + suffix):
            return name[: -len(suffix)]
    return None


def _fence(t: GGUFTensor, role: Role) -> None:
    allowed = FENCES[role]
    if t.qtype in allowed:
        return
    note = ""
    if t.type_id == GGMLType.NVFP4:
        note = (" (llama.cpp's NVFP4, id 40, is a different format from Muser's "
                "NVFP4_E2M1, id 1000)")
    raise DtypeFenceError(
        f"tensor {t.name!r}: type {t.type_name} (id {t.type_id}) is not admitted for a "
        f"{role.value}; expected one of {', '.join(sorted(q.name for q in allowed))}{note}")


def _describe(name: str, cfg: GlimmerConfig) -> str:
    """The config values a tensor's shape comes from, for shape errors."""
    part = name.split(".")[-2]
    c = cfg
    return {
        "token_embd": f"hidden {c.hidden}, vocab_size {c.vocab_size}",
        "output": f"hidden {c.hidden}, vocab_size {c.vocab_size}",
        "attn_q": f"hidden {c.hidden}, {c.n_heads} heads x head_dim {c.head_dim}",
        "attn_gate": f"hidden {c.hidden}, {c.n_heads} heads x head_dim {c.head_dim}",
        "attn_k": f"hidden {c.hidden}, {c.n_kv_heads} kv heads x head_dim {c.head_dim}",
        "attn_v": f"hidden {c.hidden}, {c.n_kv_heads} kv heads x head_dim {c.head_dim}",
        "attn_output": f"{c.n_heads} heads x head_dim {c.head_dim}, hidden {c.hidden}",
        "ffn_gate": f"hidden {c.hidden}, ffn {c.ffn}",
        "ffn_up": f"hidden {c.hidden}, ffn {c.ffn}",
        "ffn_down": f"ffn {c.ffn}, hidden {c.hidden}",
        "attn_q_norm": f"head_dim {c.head_dim}",
        "attn_k_norm": f"head_dim {c.head_dim}",
    }.get(part, f"hidden {c.hidden}")


# ---- binding -----------------------------------------------------------------

def packed_weight(gguf: GGUFFile, name: str) -> PackedWeight:
    """The packed weight ``name`` with its companions bound (CompanionError if
    an NVFP4_E2M1 tensor lacks them; UnsupportedTypeError for a type that
    cannot be computed)."""
    t = gguf[name]
    qtype = t.require_qtype()
    scales = scale_2 = None
    if qtype in NEEDS_COMPANIONS:
        scales, scale_2 = gguf.companions(name)
    return PackedWeight(name, qtype, t.n_out, t.n_in, t.packed, scales, scale_2)


def bind_weights(gguf: GGUFFile) -> dict[str, PackedWeight]:
    """Every tensor except NVFP4 companions (which are folded into their
    weight), in file order. Call ``admit`` first: binding checks only what it
    needs to build each weight."""
    out = {}
    for name in gguf.tensors:
        if _companion_parent(name) is None:
            out[name] = packed_weight(gguf, name)
    return out
