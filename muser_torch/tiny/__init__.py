"""Synthetic Glimmers: the file writer (``writer.py``), a random vision
projector (``mmproj.py``) and ``muser-torch make-tiny`` (``cli.py``) over
the Muser lanes' weight recipes, which is a fact of the architecture and
lives in ``arch/glimmer_recipe.py``."""
from ..arch.glimmer_recipe import (SEED_CONFIG, plan, planned_bytes, recipe_type, recipe_weight,
                                   tensor_std)
from .cli import register
from .mmproj import write_random_mmproj
from .writer import gguf_metadata, write_tiny

__all__ = ["register", "SEED_CONFIG", "plan", "planned_bytes", "recipe_type", "recipe_weight",
           "tensor_std", "gguf_metadata", "write_tiny", "write_random_mmproj"]
