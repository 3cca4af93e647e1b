"""``muser-torch convert``: Hugging Face safetensors checkpoints to GGUF, the
file llama.cpp's converter (and ``llama-quantize``) would write, or, for Muse
Glimmer, a Muser lane (q4_k_xl, nvfp4; a ModelOpt NVFP4 checkpoint passes
through without re-quantizing), or a DFlash drafter with its target's
vocabulary (``target_model_dir``). ``convert(hf_dir, out, type)`` is the whole of it;
``command`` is the CLI."""
from __future__ import annotations

from ..errors import (CheckpointError, ConfigMismatchError, ConvertError, OutputExistsError,
                      OutputPathError, RecipeError, TokenizerConvertError, UnsupportedArchitectureError)
from .pipeline import ConvertResult, convert
from .recipes import TYPES

__all__ = ["convert", "ConvertResult", "TYPES", "ConvertError", "CheckpointError",
           "ConfigMismatchError", "OutputExistsError", "OutputPathError",
           "RecipeError", "TokenizerConvertError",
           "UnsupportedArchitectureError"]


def register(subparsers) -> None:
    from .command import register as _register
    _register(subparsers)
