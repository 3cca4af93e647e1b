"""Two tiny random models whose files carry tool-calling chat templates, as
session fixtures: ``chatml_tools_model`` (qwen2, a byte-level BPE vocabulary
with Qwen's ChatML control tokens and ``<tool_call>`` / ``</tool_call>`` as
USER_DEFINED tokens, as Qwen's GGUFs have them; the Qwen 2.5 tool template)
``llama3_tools_model`` (llama, the same kind of vocabulary with Llama 3's
header and end-of-turn tokens; the Llama 3.1 JSON tool template), and
``chatml_default_model`` (the first one's vocabulary without a template:
the server's default ChatML). The
templates are the tests' own (``tests/text``); their weights are random, so
their answers are garbage unless a grammar holds them."""
from __future__ import annotations

import pytest
import torch

from ..text.chat_templates import LLAMA3_TOOLS
from ..text.family_templates import QWEN25_TOOLS

CONTEXT = 1024
SEED = 4747         # the files only need to exist; their weights' draw is not under test
LLAMA3_CONTROLS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                   "<|python_tag|>"]


def _tokenizer(pre: str, controls: list[str], user_defined: list[str], template: str | None,
               bos: str, eos: str) -> dict:
    from ..text.tiny_tokenizers import CONTROL, USER_DEFINED, gpt2_metadata
    md = gpt2_metadata(seed=0, vocab_size=400, pre=pre)
    md["tokenizer.ggml.tokens"] = md["tokenizer.ggml.tokens"] + controls + user_defined
    md["tokenizer.ggml.token_type"] = (md["tokenizer.ggml.token_type"] + [CONTROL] * len(controls)
                                       + [USER_DEFINED] * len(user_defined))
    tokens = md["tokenizer.ggml.tokens"]
    md["tokenizer.ggml.bos_token_id"] = tokens.index(bos)
    md["tokenizer.ggml.eos_token_id"] = tokens.index(eos)
    if template is not None:
        md["tokenizer.chat_template"] = template
    else:
        del md["tokenizer.chat_template"]
    return md


def _model(root, arch: str, tokenizer: dict, name: str):
    from muser_torch.models import from_gguf

    from ..formats.ggml_ref import lib as ggml_lib
    from ..models.hf_files import write_random_gguf
    ggml_lib()
    path = write_random_gguf(root / f"{name}.gguf", arch, seed=SEED, types=("Q8_0",),
                             n_layers=1, hidden=64, ffn=128, n_heads=2, n_kv_heads=1,
                             context=CONTEXT, tokenizer=tokenizer)
    return from_gguf(str(path), dtype=torch.float32)


@pytest.fixture(scope="session")
def chatml_tools_model(tmp_path_factory):
    pytest.importorskip("transformers")
    md = _tokenizer("qwen2", [], ["<tool_call>", "</tool_call>"], QWEN25_TOOLS,
                    bos="<|endoftext|>", eos="<|im_end|>")
    return _model(tmp_path_factory.mktemp("chatml-tools"), "qwen2", md, "qwen25-tools")


@pytest.fixture(scope="session")
def chatml_default_model(tmp_path_factory):
    pytest.importorskip("transformers")
    md = _tokenizer("qwen2", [], ["<tool_call>", "</tool_call>"], None,
                    bos="<|endoftext|>", eos="<|im_end|>")
    return _model(tmp_path_factory.mktemp("chatml-default"), "qwen2", md, "no-template")


@pytest.fixture(scope="session")
def llama3_tools_model(tmp_path_factory):
    pytest.importorskip("transformers")
    md = _tokenizer("llama-bpe", LLAMA3_CONTROLS, [], LLAMA3_TOOLS,
                    bos="<|begin_of_text|>", eos="<|eot_id|>")
    return _model(tmp_path_factory.mktemp("llama3-tools"), "llama", md, "llama3-tools")
