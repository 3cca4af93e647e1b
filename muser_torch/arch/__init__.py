"""The architectures muser-torch runs, as tables (``spec.py`` says how one is
described): ``ARCHITECTURES`` maps ``general.architecture`` to its facts.

Adding one: a module here with its config (``spec.DECODER_KEYS`` plus its own
keys and ranges), its tensor table (the llama.cpp names of ``names.py`` it
has; new names go there) and fences, a row below, and its model in
``muser_torch/models/``."""
from __future__ import annotations

from typing import Any

from ..errors import MetadataError
from .dflash import DFLASH
from .gemma3 import GEMMA3
from .muse_glimmer import MUSE_GLIMMER
from .llama import LLAMA
from .qwen import QWEN2, QWEN3
from .spec import Architecture, Role, TensorSpec

__all__ = ["ARCHITECTURES", "architecture_of", "Architecture", "Role", "TensorSpec"]

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in (DFLASH, GEMMA3, LLAMA, MUSE_GLIMMER, QWEN2,
                                                              QWEN3)}


def architecture_of(md: dict[str, Any], where: str) -> Architecture:
    """The architecture a file's ``general.architecture`` names; MetadataError,
    listing the supported ones, when it is missing or not one of them."""
    supported = ", ".join(map(repr, sorted(ARCHITECTURES)))
    name = md.get("general.architecture")
    if name is None:
        raise MetadataError(f"{where}: metadata key 'general.architecture' is missing; "
                            f"muser-torch runs {supported}")
    if not isinstance(name, str) or name not in ARCHITECTURES:
        raise MetadataError(f"{where}: general.architecture is {name!r}, which muser-torch "
                            f"does not run; supported: {supported}")
    return ARCHITECTURES[name]
