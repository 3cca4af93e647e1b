"""Admission bounds every metadata number by what the model can use and every
count by what the file holds (the fuzz harness's loader regressions,
``tests/fuzz/known.py``): each refusal is
a MetadataError naming the key, reached without building anything per claimed
layer (measured as Python memory allocated, not time)."""
from __future__ import annotations

import tracemalloc

import pytest
from gguf.constants import GGUFValueType as V

from muser_torch import Glimmer
from muser_torch.errors import MetadataError
from muser_torch.gguf_io import load_gguf, save_gguf

from .conftest import SEED

CASES = {  # key -> (value, its GGUF type)
    "u32-max layers": ("muse-glimmer.block_count", 4294967295, V.UINT32),
    "a million layers": ("muse-glimmer.block_count", 1_000_000, V.UINT32),
    "1e308 window": ("muse-glimmer.attention.sliding_window", 1e308, V.FLOAT64),
    "2^40 context": ("muse-glimmer.context_length", 1 << 40, V.UINT64),
    "zero epsilon": ("muse-glimmer.attention.layer_norm_rms_epsilon", 0.0, V.FLOAT32),
    "epsilon 1": ("muse-glimmer.attention.layer_norm_rms_epsilon", 1.0, V.FLOAT32),
    "NaN epsilon": ("muse-glimmer.attention.layer_norm_rms_epsilon", float("nan"), V.FLOAT32),
    "infinite rope base": ("muse-glimmer.rope.freq_base", float("inf"), V.FLOAT32),
    "negative rope base": ("muse-glimmer.rope.freq_base", -1e4, V.FLOAT32),
    "u64-max heads": ("muse-glimmer.attention.head_count", (1 << 64) - 1, V.UINT64),
    "infinite bos id": ("tokenizer.ggml.bos_token_id", float("inf"), V.FLOAT32),
    "infinite eos id": ("tokenizer.ggml.eos_token_id", float("-inf"), V.FLOAT32),
    # Muse Glimmer's own keys
    "zero softcap": ("muse-glimmer.final_logit_softcapping", 0.0, V.FLOAT32),
    "negative softcap": ("muse-glimmer.final_logit_softcapping", -20.0, V.FLOAT32),
    "NaN logit scale": ("muse-glimmer.logit_scale", float("nan"), V.FLOAT32),
    "zero logit scale": ("muse-glimmer.logit_scale", 0.0, V.FLOAT32),
    "infinite SWA rope base": ("muse-glimmer.rope.freq_base_swa", float("inf"), V.FLOAT32),
    "negative pattern period": ("muse-glimmer.attention.sliding_window_pattern", -4, V.INT32),
    "string pattern": ("muse-glimmer.attention.sliding_window_pattern", "4", V.STRING),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_out_of_range_metadata_is_refused_naming_the_key(tiny_files, tmp_path, case):
    key, value, vtype = CASES[case]
    g = load_gguf(tiny_files["q4_k_xl"])
    md = dict(g.metadata) | {key: value}
    types = dict(g.metadata_types) | {key: vtype}
    path = tmp_path / "bad.gguf"
    save_gguf(path, md, dict(g.tensors), types=types)
    tracemalloc.start()
    try:
        with pytest.raises(MetadataError) as info:
            Glimmer.from_gguf(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert key.split(".", 1)[1] in str(info.value), f"{case}: {info.value} (seed {SEED})"
    # a 1M-layer name table alone would take hundreds of MB
    assert peak < 16 << 20, f"{case}: {peak / 1e6:.1f} MB allocated before the refusal"
