"""Fail-closed admission of a GGUF for any architecture in ``arch``, and
binding of its packed weights.

``check`` runs every check before any weight is used and returns the
architecture, its config and the optional tensor groups the file has; each
refusal is an ``AdmissionError`` subclass whose message names the tensor (or
key), what was found and what was expected. The checks, in order:

1. architecture: ``general.architecture`` is one muser-torch runs;
2. the architecture's own metadata checks (Muse Glimmer: its lane key), and no
   ``<arch>.*`` key the graph does not follow (one it ignored could change
   the math: a RoPE scaling, an attention scale, experts, ...);
3. metadata: the config's keys are present, each within its range, and
   usable together;
4. counts: the claimed layers fit in the tensors the file holds, before
   anything is built per layer;
5. tensor set: exactly the tensors the config implies (an optional group on
   every layer or on none; NVFP4 companions only beside NVFP4 tensors);
6. per tensor, in file order: the dtype fence of its role, then its shape;
7. companions, then the architecture's own tensor checks (Muse Glimmer: the lane
   against the tensors).

Nothing is converted: a tensor of a type outside its fence is refused, not
dequantized and re-packed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .arch import Architecture, Role, architecture_of
from .arch.spec import describe, expand
from .errors import CompanionError, DtypeFenceError, MetadataError, ShapeMismatchError, TensorSetError
from .formats import GGMLType, PackedWeight
from .formats.types import NEEDS_COMPANIONS
from .gguf_io import SCALE2_SUFFIX, SCALE_SUFFIX, GGUFFile, GGUFTensor

__all__ = ["check", "admit", "Admitted", "Role", "PackedWeight",
           "packed_weight", "bind_weights"]


@dataclass(frozen=True)
class Admitted:
    arch: Architecture
    config: Any
    groups: frozenset[str]     # the optional tensor groups the file has


def admit(gguf: GGUFFile) -> Any:
    """Check a parsed file; return its config or raise."""
    return check(gguf).config


def check(gguf: GGUFFile, arch: Architecture | None = None) -> Admitted:
    """Check a parsed file (as ``arch`` when given: another architecture is
    refused by name); return what was admitted or raise."""
    where = gguf.path.name
    md = gguf.metadata
    found = architecture_of(md, where)
    if arch is not None and found is not arch:
        raise MetadataError(f"{where}: general.architecture is {found.name!r}, expected "
                            f"{arch.name!r} ({arch.title}); muser_torch.from_gguf reads any "
                            f"supported architecture")
    arch = found
    if arch.check_metadata is not None:
        arch.check_metadata(md, where)
    arch.check_keys(md, where)
    cfg = _config(arch, md, where)
    _bound_layers(arch, cfg, gguf)
    groups = _groups(arch, cfg, gguf)
    expected = expand(arch, cfg, groups)

    companions = {n for n in gguf.tensors if _companion_parent(n) is not None}
    missing = [n for n in expected if n not in gguf.tensors]
    if missing:
        raise TensorSetError(
            f"{where}: missing tensor {missing[0]!r}" +
            (f" and {len(missing) - 1} more" if len(missing) > 1 else "") +
            f" (a {cfg.n_layers}-layer {arch.title} needs {len(expected)} tensors)")
    unexpected = [n for n in gguf.tensors if n not in expected and n not in companions]
    if unexpected:
        raise TensorSetError(f"{where}: unexpected tensor {unexpected[0]!r}"
                             + (f" and {len(unexpected) - 1} more" if len(unexpected) > 1 else "")
                             + f"; {arch.title} does not use it")

    for name, t in gguf.tensors.items():
        if name in companions:
            continue
        spec, _ = expected[name]
        _fence(t, spec.role, arch)
        ne = spec.shape(cfg)
        if t.ne != ne:
            raise ShapeMismatchError(
                f"tensor {name!r}: ne {list(t.ne)} but the config expects {list(ne)} "
                f"({describe(spec, cfg)})")

    for name in sorted(companions, key=lambda n: gguf.tensors[n].offset):
        parent = _companion_parent(name)
        pt = gguf.tensors.get(parent)
        if pt is None or pt.type_id != GGMLType.NVFP4_E2M1:
            found_type = "no such tensor" if pt is None else pt.type_name
            raise CompanionError(f"tensor {name!r} is an NVFP4 companion, but {parent!r} is "
                                 f"{found_type}, expected NVFP4_E2M1")
    if arch.check_tensors is not None:
        arch.check_tensors(gguf, cfg)
    return Admitted(arch, cfg, frozenset(groups))


def _config(arch: Architecture, md: dict, where: str) -> Any:
    try:
        return arch.config.from_metadata(md)
    except KeyError as e:
        raise MetadataError(f"{where}: metadata key {e.args[0]!r} is missing "
                            f"(required for general.architecture {arch.name!r})") from None
    except (ValueError, OverflowError) as e:   # a bad value, or float() of a huge int
        raise MetadataError(f"{where}: {e}") from None


def _bound_layers(arch: Architecture, cfg: Any, gguf: GGUFFile) -> None:
    """Refuse a layer count the file cannot hold before anything is built per
    layer (a u32-max ``block_count`` would otherwise build billions of names)."""
    need = cfg.n_layers * arch.per_layer_required()
    if need > len(gguf.tensors):
        raise MetadataError(
            f"{gguf.path.name}: {arch.name}.block_count is {cfg.n_layers}, but the file holds "
            f"{len(gguf.tensors)} tensors and each {arch.title} layer needs "
            f"{arch.per_layer_required()} (at most {len(gguf.tensors) // arch.per_layer_required()} "
            f"layers fit)")


def _groups(arch: Architecture, cfg: Any, gguf: GGUFFile) -> set[str]:
    """The optional groups the file has; each is present for every layer or none."""
    have_groups = set()
    for group, what in arch.groups.items():
        names = [n for n, (s, _) in expand(arch, cfg, {group}).items() if s.group == group]
        have = [n in gguf.tensors for n in names]
        if any(have) and not all(have):
            raise TensorSetError(f"{gguf.path.name}: {what} are present on some layers but "
                                 f"tensor {names[have.index(False)]!r} is missing")
        if all(have):
            have_groups.add(group)
    return have_groups


def _companion_parent(name: str) -> str | None:
    for suffix in (SCALE_SUFFIX, SCALE2_SUFFIX):
        if name.endswith(".weight" + suffix):
            return name[: -len(suffix)]
    return None


def _fence(t: GGUFTensor, role: Role, arch: Architecture) -> None:
    allowed = arch.fences[role]
    if t.qtype in allowed:
        return
    note = ""
    if t.type_id == GGMLType.NVFP4:
        note = (" (llama.cpp's NVFP4, id 40, is a different format from Muser's "
                "NVFP4_E2M1, id 1000)")
    raise DtypeFenceError(
        f"tensor {t.name!r}: type {t.type_name} (id {t.type_id}) is not admitted for a "
        f"{role.value}; expected one of {', '.join(sorted(q.name for q in allowed))}{note}")


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
    weight), in file order. Call ``check`` first: binding checks only what it
    needs to build each weight."""
    out = {}
    for name in gguf.tensors:
        if _companion_parent(name) is None:
            out[name] = packed_weight(gguf, name)
    return out
