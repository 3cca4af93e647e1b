"""muser-torch: GGUF K-quant and NVFP4 weights, kept packed, as PyTorch ops."""
from .formats import GGMLType, quantize
from .ops.dequant import dequantize
from .errors import ContextLengthError, GGUFError
from .gguf_io import GGUFFile, load_gguf, save_gguf
from .nn import QEmbedding, QLinear
from .models import from_gguf
from .glimmer import Glimmer, GlimmerConfig

__all__ = ["GGMLType", "dequantize", "quantize", "GGUFError", "ContextLengthError", "GGUFFile", "load_gguf", "save_gguf",
           "QLinear", "QEmbedding", "from_gguf", "Glimmer", "GlimmerConfig"]
__version__ = "0.1.0"
