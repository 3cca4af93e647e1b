"""``--type iq4_xs``, ``iq4_nl`` and ``mxfp4`` are llama.cpp's converter then
``llama-quantize ... IQ4_XS / IQ4_NL / MXFP4_MOE`` in one step: the same bytes
as llama-quantize writes from the F16 file, per-tensor types included
(llama_tensor_get_type: Q6_K or Q8_0 on the lm_head or tied embedding, Q5_K
on attn_v when n_gqa >= 4 and on the first n_layers / 8 ffn_down, IQ4_NL where
rows are not whole 256-blocks, Q8_0 everywhere for MXFP4_MOE on a dense model)."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from muser_torch.convert.recipes import plan_types  # noqa: E402

from .. import slow  # noqa: E402
from ..gguf.helpers import fresh_seed  # noqa: E402
from .checkpoints import write_checkpoint  # noqa: E402
from .peers import assert_like_llama_quantize, need_llama_quantize  # noqa: E402

FTYPES = {"iq4_xs": "IQ4_XS", "iq4_nl": "IQ4_NL", "mxfp4": "MXFP4_MOE"}
CASES = {
    # 8 layers: ffn_down of layer 0 is Q5_K; 4 heads over 1 kv head: attn_v Q5_K
    "llama-8-gqa4": ("llama", {"n_layers": 8, "hidden": 256, "ffn": 512, "n_heads": 4,
                               "n_kv_heads": 1}, None),
    # rows of 320 (ffn_down) and a tied embedding: the IQ4_NL fallback, a Q6_K/Q8_0 embedding
    "qwen2-tied-ffn320": ("qwen2", {"tied": True, "ffn": 320, "n_layers": 3}, "qwen2"),
}


# The 8-layer case takes the attn_v and ffn_down rules, which IQ4_XS and IQ4_NL share
# and MXFP4_MOE skips (test_recipe_choices holds them by default); against llama-quantize's
# bytes it runs in the slow sweep.
PAIRS = [("qwen2-tied-ffn320", k) for k in FTYPES] + [
    slow.param("llama-8-gqa4", k) for k in ("iq4_xs", "iq4_nl", "mxfp4")]


@pytest.mark.parametrize("case,kind", PAIRS)
def test_same_file_as_llama_quantize(tmp_path, case, kind):
    need_llama_quantize()
    arch, opts, pre = CASES[case]
    seed = fresh_seed()
    d, _, _ = write_checkpoint(tmp_path / case, arch, seed, **opts)
    assert_like_llama_quantize(d, tmp_path, kind, FTYPES[kind], pre, f"seed {seed}: {case} {kind}")


def test_recipe_choices():
    """The per-tensor rules on a plan alone (no peer needed)."""
    t = [("token_embd.weight", (256, 64)), ("output.weight", (256, 64))]
    for i in range(8):
        t += [(f"blk.{i}.attn_v.weight", (256, 64)), (f"blk.{i}.ffn_down.weight", (512, 256)),
              (f"blk.{i}.ffn_up.weight", (256, 320)), (f"blk.{i}.attn_norm.weight", (256,))]
    t += [("blk.0.attn_q.weight", (320, 256))]
    xs = {p.name: p.qtype.name for p in plan_types(t, "iq4_xs", 8, n_gqa=4)}
    assert xs["token_embd.weight"] == "IQ4_XS" and xs["output.weight"] == "Q6_K"
    assert xs["blk.0.ffn_down.weight"] == "Q5_K" and xs["blk.1.ffn_down.weight"] == "IQ4_XS"
    assert xs["blk.3.attn_v.weight"] == "Q5_K" and xs["blk.0.attn_norm.weight"] == "F32"
    assert xs["blk.0.attn_q.weight"] == "IQ4_NL"                    # rows of 320
    assert {p.qtype.name for p in plan_types(t, "iq4_xs", 8, n_gqa=2)
            if "attn_v" in p.name} == {"IQ4_XS"}
    nl = {p.name: p.qtype.name for p in plan_types(t, "iq4_nl", 8, n_gqa=1)}
    assert nl["blk.0.attn_q.weight"] == "IQ4_NL" and nl["blk.5.attn_v.weight"] == "IQ4_NL"
    mx = {p.qtype.name for p in plan_types(t, "mxfp4", 8)}
    assert mx == {"Q8_0", "F32"}
