"""Synthetic Glimmers: the seed's weight recipe (``recipe.py``), the file
writer (``writer.py``) and ``muser-torch make-tiny`` (``cli.py``)."""
from .cli import register
from .recipe import SEED_CONFIG, plan, planned_bytes, recipe_type, recipe_weight, tensor_std
from .writer import gguf_metadata, write_tiny

__all__ = ["register", "SEED_CONFIG", "plan", "planned_bytes", "recipe_type", "recipe_weight",
           "tensor_std", "gguf_metadata", "write_tiny"]
