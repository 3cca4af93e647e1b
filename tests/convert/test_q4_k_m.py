"""``--type q4_k_m`` is llama.cpp's converter then ``llama-quantize ... Q4_K_M``
in one step: the same bytes as llama-quantize writes from the F16 file (whose
equality with llama.cpp's converter ``test_peer`` holds), per-tensor types
included (llama_tensor_get_type: Q6_K on the lm_head or tied embedding,
attn_v and ffn_down on the use_more_bits layers, the fallbacks for rows not
divisible by 256), with and without an importance matrix (llama.cpp's imatrix
GGUF)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from muser_torch.convert import convert  # noqa: E402
from muser_torch.gguf_io import load_gguf, save_gguf  # noqa: E402

from ..gguf.helpers import fresh_seed  # noqa: E402
from .checkpoints import write_checkpoint  # noqa: E402
from .peers import (assert_like_llama_quantize, assert_same_file, need_llama_quantize,  # noqa: E402
                    run_llama_quantize)

CASES = {
    # 8 layers: use_more_bits picks layers 0, 3, 6, 7
    "llama-8": ("llama", {"n_layers": 8, "hidden": 256, "ffn": 512}, None),
    # rows of 320 (ffn_down) and a tied embedding: Q5_0 / Q8_0 fallbacks, Q6_K embedding
    "qwen2-tied-ffn320": ("qwen2", {"tied": True, "ffn": 320, "n_layers": 3}, "qwen2"),
    "gemma3": ("gemma3", {"head_dim": 64, "n_layers": 3}, None),
}


def write_imatrix(path, tensors: dict[str, int], seed: int) -> None:
    """llama.cpp's imatrix GGUF: per weight NAME.in_sum2 (F32 [n_in]) and
    NAME.counts (F32 [1]), with its dataset and chunk keys."""
    gen = torch.Generator().manual_seed(seed)
    specs = {}
    for name, n_in in tensors.items():
        count = float(torch.randint(1, 500, (), generator=gen))
        sums = torch.rand(n_in, generator=gen) ** 3 * 10 * count   # skewed, never negative
        specs[name + ".in_sum2"] = ("F32", sums.reshape(1, n_in))
        specs[name + ".counts"] = ("F32", torch.tensor([[count]]))
    save_gguf(path, {"general.type": "imatrix", "imatrix.datasets": ["random.txt"],
                     "imatrix.chunk_count": 17, "imatrix.chunk_size": 512}, specs)


@pytest.mark.parametrize("case", list(CASES))
def test_same_file_as_llama_quantize(tmp_path, case):
    need_llama_quantize()
    arch, opts, pre = CASES[case]
    seed = fresh_seed()
    d, _, _ = write_checkpoint(tmp_path / case, arch, seed, **opts)
    ours = assert_like_llama_quantize(d, tmp_path, "q4_k_m", "Q4_K_M", pre, f"seed {seed}: {case} q4_k_m")
    types = {t.type_name for t in load_gguf(ours).tensors.values()}
    assert {"Q4_K", "Q6_K"} <= types, f"seed {seed}: {types}"


def test_same_file_as_llama_quantize_with_imatrix(tmp_path):
    need_llama_quantize()
    seed = fresh_seed()
    d, _, _ = write_checkpoint(tmp_path / "ck", "llama", seed, n_layers=2)
    f16 = convert(d, tmp_path / "f16.gguf", "f16", progress=False).path
    weights = {n: t.ne[0] for n, t in load_gguf(f16).tensors.items()
               if len(t.ne) == 2 and n != "token_embd.weight"}
    im = tmp_path / "imatrix.gguf"
    write_imatrix(im, weights, seed)
    theirs = tmp_path / "llama-quantize.gguf"
    run_llama_quantize(f16, theirs, "Q4_K_M", imatrix=im)
    ours = convert(d, tmp_path / "ours.gguf", "q4_k_m", imatrix=im, progress=False).path
    assert_same_file(ours, theirs, f"seed {seed}: llama q4_k_m imatrix")
    plain = convert(d, tmp_path / "plain.gguf", "q4_k_m", progress=False).path
    assert load_gguf(plain)["blk.0.attn_q.weight"].raw.tolist() != load_gguf(ours)["blk.0.attn_q.weight"].raw.tolist()


# llama-quantize's other K-quant ftypes: (their name for it, the types the file must hold:
# the default, and the types of attn_v, ffn_down and attn_output)
LOW_BIT = {"q3_k_m": ("Q3_K_M", {"Q3_K", "Q4_K", "Q5_K"}),
           "q2_k": ("Q2_K", {"Q2_K", "Q3_K"})}


@pytest.mark.parametrize("kind", list(LOW_BIT))
@pytest.mark.parametrize("case", ["llama-8", "gemma3"])
def test_low_bit_same_file_as_llama_quantize(tmp_path, case, kind):
    """q3_k_m and q2_k: llama_tensor_get_type's per-tensor choices for those
    ftypes (attn_v by layer or by n_gqa, ffn_down, attn_output) and the
    Q2_K / Q3_K bytes, as llama-quantize writes them."""
    need_llama_quantize()
    arch, opts, pre = CASES[case]
    ftype, want = LOW_BIT[kind]
    seed = fresh_seed()
    d, _, _ = write_checkpoint(tmp_path / case, arch, seed, **opts)
    f16 = convert(d, tmp_path / "f16.gguf", "f16", pre_tokenizer=pre, progress=False).path
    theirs = tmp_path / "llama-quantize.gguf"
    run_llama_quantize(f16, theirs, ftype)
    ours = convert(d, tmp_path / "ours.gguf", kind, pre_tokenizer=pre, progress=False).path
    assert_same_file(ours, theirs, f"seed {seed}: {case} {kind}")
    types = {t.type_name for t in load_gguf(ours).tensors.values()}
    assert want <= types, f"seed {seed}: {types}"
