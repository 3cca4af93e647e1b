"""muser-torch: GGUF K-quant and NVFP4 weights, kept packed, as PyTorch ops."""
from .formats import GGMLType, dequantize, quantize

__all__ = ["GGMLType", "dequantize", "quantize"]
__version__ = "0.1.0"
