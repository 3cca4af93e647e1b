"""Muse Glimmer files written as llama.cpp's converter writes them
(``muse_files.py``), with every matrix quantized by ggml in a mix of the
types those files carry, against transformers' own ``MuseGlimmerTextModel``
holding the dequantized weights: logits, greedy continuation, incremental
decode past the window in several slots, the layer pattern (array and
integer) and the sliding layers' RoPE base.

5 layers (global layers 0 and 4, counted back from the last), a 6-token
window, prompts of 20+ tokens. ``SEED`` (conftest) replays a run."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.arch.muse_glimmer import ARCH, HF_NAMES, NORM_SHIFTED, SYNTHESIZED

from ..formats.ggml_ref import lib
from .conftest import SEED, rel_err
from .muse_files import MIX, TEXT_PREFIX, reference_model, write_muse_gguf
from ..slots import decode_in_slots
from ..bounds import check_bound

pytest.importorskip("transformers.models.muse_glimmer")
VOCAB = 320


@pytest.fixture(scope="module")
def muse(tmp_path_factory):
    """(our model, transformers' model, path) of one random file."""
    lib()
    path, cfg = write_muse_gguf(tmp_path_factory.mktemp("muse") / "muse.gguf", seed=SEED)
    return muser_torch.from_gguf(path, dtype=torch.float32), reference_model(path, cfg), path


def _ids(n: int, batch: int = 1, salt: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED * 13 + salt)
    return torch.randint(0, VOCAB, (batch, n), generator=g)


def test_hf_table_matches_transformers():
    """The converter table (arch/muse_glimmer.py) names exactly transformers'
    text parameters, plus the lm_head; the four centered norms are the ones shifted."""
    from transformers.models.muse_glimmer.modeling_muse_glimmer import MuseGlimmerTextModel
    from .muse_files import text_config
    cfg = text_config(n_layers=2, hidden=64, ffn=128, n_heads=2, n_kv_heads=1, head_dim=32,
                      vocab=50, context=64, window=8, rope_theta=1e4, rms_eps=1e-6,
                      qk_scale=3.87, logit_scale=1.0, softcap=20.0)
    with torch.device("meta"):
        names = {n for n in MuseGlimmerTextModel(cfg).state_dict() if "inv_freq" not in n}
    table = {h[len(TEXT_PREFIX):].format(i=i) for h in HF_NAMES.values() if h.startswith(TEXT_PREFIX)
             for i in range(2)}
    assert table == names
    assert HF_NAMES["output.weight"] == "lm_head.weight"
    shifted = {HF_NAMES[k].rsplit(".", 2)[-2] for k in NORM_SHIFTED}
    assert shifted == {"input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                       "post_feedforward_layernorm"}
    assert set(SYNTHESIZED) == {"blk.{i}.attn_q_norm.weight", "blk.{i}.attn_k_norm.weight"}


def test_file_holds_every_type_of_the_mix(muse):
    _, _, path = muse
    types = {t.qtype.name for t in muser_torch.load_gguf(path).tensors.values()}
    assert set(MIX) <= types, f"types in the file: {sorted(types)} (seed {SEED})"
    md = muser_torch.load_gguf(path).metadata
    assert md[f"{ARCH}.attention.sliding_window_pattern"] == [False, True, True, True, False]


def test_logits_match_transformers(muse):
    ours, ref, _ = muse
    ids = _ids(23, batch=2)
    got, want = ours(ids), ref(ids)
    err = rel_err(got, want)
    check_bound("logits: rel err to transformers", err, 1e-3, f"relative error {err:.2e} against transformers (seed {SEED})")
    assert float(want.std()) > 0.5, f"degenerate logits (seed {SEED})"
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.95, f"seed {SEED}"


def test_greedy_continuation_is_transformers(muse):
    ours, ref, _ = muse
    prompt = _ids(9, salt=1)[0]
    got = ours.generate(prompt, 16, temperature=0.0)
    got = got[-16:] if got.dim() == 1 else got[0, -16:]
    ids = prompt[None]
    for _ in range(16):
        nxt = ref(ids)[0, -1].argmax()
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    assert got.tolist() == ids[0, -16:].tolist(), f"seed {SEED}"


def test_incremental_decode_in_slots_past_the_window(muse):
    """Three sequences prefilled into slots 2, 0, 3, then decoded together
    well past the 6-token window: each step equals transformers' full forward."""
    ours, ref, _ = muse
    lengths, steps = [5, 11, 17], 10
    seqs = [_ids(n + steps, salt=10 + i)[0] for i, n in enumerate(lengths)]
    inc = decode_in_slots(ours, seqs, lengths, [2, 0, 3], steps, max_seq_len=64)
    for i, (seq, n) in enumerate(zip(seqs, lengths)):
        want = ref(seq[None])[0, n:n + steps]
        err = rel_err(inc[i], want)
        check_bound("batched logits: rel err to transformers", err, 1e-3, f"sequence {i}: relative error {err:.2e} (seed {SEED})")


def test_integer_period_and_swa_base_follow_llama_cpp(tmp_path):
    """An integer ``sliding_window_pattern`` is llama.cpp's period counted from
    layer 0 (period 4, 5 layers: layer 3 global), and ``rope.freq_base_swa``
    is the sliding layers' base (transformers' rope_theta here) whatever
    ``rope.freq_base`` says."""
    lib()

    def edit(md, tensors):
        md[f"{ARCH}.attention.sliding_window_pattern"] = 4
        md[f"{ARCH}.rope.freq_base_swa"] = md[f"{ARCH}.rope.freq_base"]
        md[f"{ARCH}.rope.freq_base"] = 5e5

    path, cfg = write_muse_gguf(tmp_path / "p.gguf", seed=SEED + 1, types=("Q8_0", "F16"),
                                n_layers=5, edit=edit)
    cfg.layer_types = ["full_attention" if i == 3 else "sliding_attention" for i in range(5)]
    cfg.layer_rope_theta = [0 if i == 3 else cfg.rope_parameters["rope_theta"] for i in range(5)]
    ours = muser_torch.from_gguf(path, dtype=torch.float32)
    assert [layer.attention.window for layer in ours.layers] == [6, 6, 6, None, 6]
    ref = reference_model(path, cfg)
    ids = _ids(21, salt=3)
    err = rel_err(ours(ids), ref(ids))
    check_bound("logits: rel err to transformers", err, 1e-3, f"relative error {err:.2e} (seed {SEED})")
