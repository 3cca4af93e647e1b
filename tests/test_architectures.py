"""The three architecture registries agree.

``arch.ARCHITECTURES`` (each architecture's facts), ``models.MODELS`` (its
model class) and ``convert.rules.FAMILIES`` (its converter) are written in
three layers that may not import one another upward, so they are three
tables; this test holds them to one set of names and to each other's facts
(docs/architecture.md, "Adding an architecture")."""
from __future__ import annotations

import collections

import pytest

from muser_torch.arch import ARCHITECTURES
from muser_torch.arch.names import TENSOR_NAMES
from muser_torch.convert.rules import _GLOBAL, FAMILIES, _pattern_of
from muser_torch.models import DRAFTS, MODELS, Decoder, Drafter

FAMILY_OF = {f.gguf_arch: f for f in FAMILIES}


def test_every_architecture_has_a_model_and_every_model_an_architecture():
    assert set(MODELS) | set(DRAFTS) == set(ARCHITECTURES) and not set(MODELS) & set(DRAFTS)
    for name, cls in MODELS.items():
        assert issubclass(cls, Decoder), name
        assert cls.ARCH is ARCHITECTURES[name], f"MODELS[{name!r}].ARCH is {cls.ARCH.name!r}"
    for name, cls in DRAFTS.items():
        assert issubclass(cls, Drafter) and cls.ARCH is ARCHITECTURES[name], name


def test_every_converter_writes_an_architecture_we_run():
    assert len(FAMILY_OF) == len(FAMILIES), "two converter families write one architecture"
    assert set(FAMILY_OF) <= set(ARCHITECTURES), set(FAMILY_OF) - set(ARCHITECTURES)
    hf = [a for f in FAMILIES for a in f.hf_archs]
    assert len(hf) == len(set(hf)), "a Hugging Face architecture maps to two converters"


def _converted(family) -> set[str]:
    """The table rows a family can write: tensors it maps from a checkpoint and
    tensors it synthesizes after them (asked with stand-in hyperparameters)."""
    mapped = {TENSOR_NAMES[short].name for short in (*family.layer_names.values(), *_GLOBAL.values())}
    hp = collections.defaultdict(lambda: 1.0, head_dim=4)
    made = {_pattern_of(n) for m in mapped for n, _ in family.synthesized(hp, m.format(i=0))}
    return mapped | made


@pytest.mark.parametrize("name", sorted(FAMILY_OF))
def test_a_converter_writes_every_tensor_its_architecture_needs(name):
    """Every tensor of the architecture's table that a file must hold (no
    optional group, not tied to another) is one the converter can write."""
    arch = ARCHITECTURES[name]
    needed = {s.name for s in arch.tensors if s.group is None and s.tied_to is None}
    missing = needed - _converted(FAMILY_OF[name])
    assert not missing, f"{name}: the converter cannot write {sorted(missing)}"


def test_the_check_sees_a_disagreement(monkeypatch):
    import muser_torch.models as models
    monkeypatch.setitem(models.MODELS, "no-such-arch", MODELS["llama"])
    with pytest.raises(AssertionError):
        test_every_architecture_has_a_model_and_every_model_an_architecture()
    glimmer = FAMILY_OF["muse-glimmer"]
    assert "blk.{i}.attn_q_norm.weight" in _converted(glimmer)        # synthesized
    import dataclasses
    bare = dataclasses.replace(glimmer, synthesized=lambda hp, n: [])
    assert "blk.{i}.attn_q_norm.weight" not in _converted(bare)
