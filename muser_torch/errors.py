"""Errors raised while reading GGUF files, admitting a model from one, and
converting a Hugging Face checkpoint into one (``ConvertError``), and running
past a model's context (``ContextLengthError``).

Every refusal is a ``GGUFError`` (a ``ValueError``, so the CLI prints it as a
one-line message). The file-level errors come from ``gguf_io`` while the
header is parsed; the admission errors come from ``loader.admit`` before any
weight is used. Messages name the tensor or key, what was found and what was
expected.
"""
from __future__ import annotations


class GGUFError(ValueError):
    """Base class: the file or the model in it was refused."""


# ---- the file itself --------------------------------------------------------

class GGUFFormatError(GGUFError):
    """The bytes are not a well-formed GGUF file (bad magic, bad value type,
    duplicate names, misaligned or overlapping tensor data, ...)."""


class GGUFTruncatedError(GGUFFormatError):
    """The file ends inside a header section or before a tensor's data ends."""


class UnsupportedVersionError(GGUFFormatError):
    """A GGUF version other than 2 or 3, or a big-endian file."""


class SplitFileError(GGUFError):
    """A part of a split model (``<prefix>-0000i-of-0000N.gguf``) is missing,
    misnamed, or does not belong with the others."""


class UnsupportedTypeError(GGUFError):
    """A tensor's type has no block format here; raised only when its bytes or
    values are asked for, so such files can still be listed."""


# ---- admission of a model ---------------------------------------------------

class AdmissionError(GGUFError):
    """The file is well formed but this model may not be served from it."""


class MetadataError(AdmissionError):
    """A required metadata key is missing or has an unusable value."""


class LaneError(AdmissionError):
    """``muser.weight_precision`` is missing, unknown, or contradicted by the tensors."""


class TensorSetError(AdmissionError):
    """A required tensor is missing, or a tensor the model does not use is present."""


class ShapeMismatchError(AdmissionError):
    """A tensor's shape disagrees with the shape the config implies."""


class DtypeFenceError(AdmissionError):
    """A tensor's type is not admitted for its role (projection, embedding, norm)."""


class CompanionError(AdmissionError):
    """An NVFP4_E2M1 tensor's scale companions are missing, mistyped or misshaped."""


class DraftMismatchError(AdmissionError):
    """A DFlash draft loaded without a target, or whose vocabulary, hidden size
    or tapped layers do not fit the target it was given."""


class VisionMismatchError(AdmissionError):
    """An ``mmproj`` file that is not Muse Glimmer's vision projector, or that
    does not fit the text model it was given (its output width)."""


class ChatTemplateError(MetadataError):
    """``tokenizer.chat_template`` is missing where a chat is asked for, is not
    a string, or fails to compile or render."""


# ---- conversion of a Hugging Face checkpoint (``muser_torch.convert``) -------

class ConvertError(ValueError):
    """A checkpoint cannot be converted; nothing is written at the output path."""


class OutputPathError(ConvertError):
    """The output path cannot take the file (a directory, or its folder is
    missing); raised before the checkpoint is read."""


class OutputExistsError(OutputPathError):
    """A file exists at the output path and ``force`` was not given; raised
    before the checkpoint is read."""


class CheckpointError(ConvertError):
    """The checkpoint's files are incomplete or unreadable: a missing shard, a
    truncated or malformed safetensors file, a missing config.json."""


class ConfigMismatchError(ConvertError):
    """config.json contradicts the tensors (a shape, a missing or extra tensor)."""


class UnsupportedArchitectureError(ConvertError):
    """config.json names an architecture the converter has no rules for."""


class RecipeError(ConvertError):
    """A tensor's dtype or shape cannot take the type the chosen recipe gives it."""


class TokenizerConvertError(ConvertError):
    """The tokenizer files are missing or name a pre-tokenizer llama.cpp cannot identify."""


# ---- running a model ---------------------------------------------------------------

class ContextLengthError(ValueError):
    """A prompt plus new tokens, or a cache, longer than the model's context
    or the cache's capacity; raised on the host before the step runs, and
    names both numbers (``asked``, ``capacity``)."""

    def __init__(self, message: str, asked: int, capacity: int):
        super().__init__(message)
        self.asked = asked
        self.capacity = capacity


# ---- optional packages ---------------------------------------------------------------

class MissingExtraError(ImportError):
    """A package of an optional extra (``text.requirements.EXTRAS``) is not
    installed; the message names the install command, and the CLI prints it
    as one line (exit 2)."""


# ---- images ---------------------------------------------------------------------

class ImageError(ValueError):
    """An image argument that cannot be used: not an image, unreadable, or a
    model without a vision projector."""


class ImageTooLargeError(ImageError):
    """An image with more pixels than the stated bound (``vision.preprocess.MAX_PIXELS``)."""


class PlaceholderError(ValueError):
    """The prompt's image placeholders do not match the images given."""
