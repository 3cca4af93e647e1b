"""``muser-torch inspect``: the tensor classes and totals of
docs/muse-glimmer.md on a sparse file with the full shapes, and the CLI on a
small file.

docs/muse-glimmer.md ("The geometry") gives 27,853,389,824 parameters, 4.81
bits/weight and a 16,756,681,056-byte artifact. Its projections, embedding
and lm_head sum to 16,737,949,696 bytes; the F32 norms (4 per layer and
output_norm, 209 x 6656, plus the 104 q/k norms of 128) add 5,617,664
(1,404,416 parameters), giving 16,743,567,360 tensor bytes. The remaining
13,113,696 bytes of the artifact are not tensor data: its header carries the
202,048-token tokenizer. 4.81 holds both ways.
"""
from __future__ import annotations

import json
import math
import resource
from pathlib import Path

import numpy as np
import pytest

from muser_torch import GGMLType, load_gguf, save_gguf
from muser_torch.cli import main as cli_main
from muser_torch.config import GlimmerConfig
from muser_torch.inspect import summarize
from muser_torch.loader import admit

from .helpers import fresh_seed, geometry, random_packed
from .test_loader import glimmer_tensors

SEED = GlimmerConfig(context_length=131072, hidden=6656, ffn=19968, n_layers=52, n_heads=32,
                     n_kv_heads=2, head_dim=128, rms_eps=float(np.float32(1e-6)),
                     sliding_window=2048, sliding_window_pattern=4, rope_base=1e6,
                     vocab_size=202048)
SEED_PARAMS = 27_853_389_824          # projections + embedding + lm_head (docs/muse-glimmer.md)
SEED_LM_HEAD_BYTES = 924_571_648       # 26 blocks/row x 176 B x 202,048 rows (docs/muse-glimmer.md)
SEED_Q_MATRIX_BYTES = 15_335_424       # 3,744 B/row x 4,096 rows (docs/muse-glimmer.md)
SEED_ARTIFACT_BYTES = 16_756_681_056


def _bytes(type_id, n_in, n_out):
    elems, block_bytes = geometry(int(type_id))
    return n_in // elems * block_bytes * n_out


@pytest.fixture(scope="module")
def seed_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("seed") / "glimmer-q4_k_xl.gguf"
    save_gguf(path, SEED.to_metadata(), glimmer_tensors(SEED, None), progress=False)  # sparse
    return path


def _page_faults() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_minflt + r.ru_majflt


def test_seed_artifact_totals(seed_file):
    f0 = _page_faults()
    f = load_gguf(seed_file)
    s = summarize(f)
    faults = _page_faults() - f0
    # Work done, not time: opening and summarizing map in the header's pages and
    # some heap (fault-around maps at most 16 pages a fault), never the 4M of data.
    assert f.file_size > 16_000_000_000 and faults < 1000, f"{faults} page faults to open and summarize"
    assert admit(f) == SEED

    h, v, L = SEED.hidden, SEED.vocab_size, SEED.n_layers
    norms = (4 * L + 1) * h + 2 * L * SEED.head_dim
    assert s.parameters == SEED_PARAMS + norms
    weights = (_bytes(GGMLType.Q4_K, h, v) + _bytes(GGMLType.Q5_K, h, v)
               + L * (2 * _bytes(GGMLType.Q4_K, h, 4096) + _bytes(GGMLType.Q4_K, h, 256)
                      + _bytes(GGMLType.Q4_K, 4096, h) + 2 * _bytes(GGMLType.Q4_K, h, 19968))
               + 26 * (_bytes(GGMLType.Q4_K, h, 256) + _bytes(GGMLType.Q6_K, h, 256))
               + 26 * (_bytes(GGMLType.Q4_K, 19968, h) + _bytes(GGMLType.Q6_K, 19968, h)))
    assert weights == 16_737_949_696
    assert s.tensor_bytes == weights + 4 * norms == 16_743_567_360
    assert round(s.bits_per_weight, 2) == 4.81
    assert round(SEED_ARTIFACT_BYTES * 8 / SEED_PARAMS, 2) == 4.81
    emb = _bytes(GGMLType.Q4_K, h, v)
    assert s.bytes_per_token == s.tensor_bytes - emb + emb // v
    assert emb // v == 3744 and s.lane == "q4_k_xl"

    rows = {(c.label, c.dtype, c.shape): (c.count, c.bytes) for c in s.classes}
    assert rows[("output.weight", "Q5_K", "6656→202048")] == (1, SEED_LM_HEAD_BYTES)
    assert rows[("attn_q.weight", "Q4_K", "6656→4096")] == (52, 52 * SEED_Q_MATRIX_BYTES)
    # The benchmark shapes' counts (docs/muse-glimmer.md) (q and gate, gate and up are separate rows here).
    counts = {k: c for k, (c, _) in rows.items()}
    assert counts[("attn_gate.weight", "Q4_K", "6656→4096")] == 52
    assert counts[("attn_k.weight", "Q4_K", "6656→256")] + counts[("attn_v.weight", "Q4_K", "6656→256")] == 78
    assert counts[("attn_v.weight", "Q6_K", "6656→256")] == 26
    assert counts[("attn_output.weight", "Q4_K", "4096→6656")] == 52
    assert counts[("ffn_gate.weight", "Q4_K", "6656→19968")] + counts[("ffn_up.weight", "Q4_K", "6656→19968")] == 104
    assert counts[("ffn_down.weight", "Q4_K", "19968→6656")] == 26
    assert counts[("ffn_down.weight", "Q6_K", "19968→6656")] == 26
    assert counts[("token_embd.weight", "Q4_K", "6656→202048")] == 1
    assert sum(counts.values()) == len(f.tensors) == 3 + L * 14


def test_cli_table_and_json(seed_file, capsys):
    assert cli_main(["inspect", str(seed_file)]) == 0
    out = capsys.readouterr().out
    assert "bits per weight  4.81" in out and "lane             q4_k_xl" in out
    assert "16,743,567,360" in out and "27,854,794,240" in out
    # (the label column is as wide as the longest label, post_attention_norm.weight)
    assert "ffn_down.weight             Q6_K   19968→6656" in out

    assert cli_main(["inspect", str(seed_file), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["tensor_bytes"] == 16_743_567_360 and d["lane"] == "q4_k_xl"
    assert {"label": "output.weight", "dtype": "Q5_K", "ne": [6656, 202048], "count": 1,
            "params": 6656 * 202048, "bytes": SEED_LM_HEAD_BYTES, "shape": "6656→202048"} in d["classes"]


def test_any_gguf_and_errors(tmp_path, capsys):
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    path = tmp_path / "any.gguf"
    save_gguf(path, {"general.architecture": "other"},
              {"blk.0.w": (GGMLType.Q8_0, random_packed(rng, 8, 3, 2)),
               "blk.1.w": (GGMLType.Q8_0, random_packed(rng, 8, 3, 2)),
               "x": (10, random_packed(rng, 10, 2, 1))})           # Q2_K: listed, not computed
    assert cli_main(["inspect", str(path), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["lane"] is None and d["parameters"] == 2 * 3 * 64 + 2 * 256
    assert [(c["label"], c["dtype"], c["count"]) for c in d["classes"]] == [("w", "Q8_0", 2), ("x", "Q2_K", 1)]
    assert d["tensor_bytes"] == 2 * 3 * 2 * 34 + 2 * 84, f"seed {seed}"

    (tmp_path / "bad.gguf").write_bytes(b"GGUF\x07\x00\x00\x00")
    assert cli_main(["inspect", str(tmp_path / "bad.gguf")]) == 2
    assert "version 7 is not supported" in capsys.readouterr().err


def test_nvfp4_companion_scales_are_bytes_not_parameters(tmp_path):
    """An NVFP4_E2M1 weight's E4M3 scales and scale_2 count in its bytes (4.5
    bits/weight in all) but are not weights: parameters equal the elements of
    the tensors the Glimmer config names, counted from the config alone."""
    from dataclasses import replace

    from muser_torch.glimmer import gguf_names
    from muser_torch.tiny import SEED_CONFIG, write_tiny

    seed = fresh_seed()
    config = replace(SEED_CONFIG, n_layers=2, hidden=512, ffn=1024, n_heads=4, n_kv_heads=2,
                     head_dim=128, vocab_size=300, context_length=256, sliding_window=64,
                     weight_precision="nvfp4")
    path = tmp_path / "nvfp4.gguf"
    write_tiny(path, config, seed=seed)
    s = summarize(load_gguf(path))
    expected = sum(n_out * n_in for n_out, n_in in gguf_names(config).values())
    assert s.parameters == expected, f"seed {seed}"
    assert s.tensor_bytes * 8 / s.parameters == pytest.approx(s.bits_per_weight)
    # the scale tensors exist and their bytes are in the total
    scale_bytes = sum(t.nbytes for n, t in load_gguf(path).tensors.items() if n.endswith(("_scale", "_scale_2")))
    assert scale_bytes > 0 and s.tensor_bytes > scale_bytes, f"seed {seed}"


def test_cli_takes_several_files(tmp_path, capsys):
    """``inspect demo/*.gguf``: a table per file; --json gives one object per
    file per line; a file that cannot be read is one error line, the others
    are still shown, and the exit status is 2."""
    seed = fresh_seed()
    rng = np.random.default_rng(seed)
    paths = []
    for i, n_out in enumerate((3, 5)):
        paths.append(tmp_path / f"m{i}.gguf")
        save_gguf(paths[-1], {"general.architecture": f"arch{i}"},
                  {"w": (GGMLType.Q8_0, random_packed(rng, 8, n_out, 2))})
    assert cli_main(["inspect", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert out.count("bits per weight") == 2 and "arch0" in out and "arch1" in out

    assert cli_main(["inspect", *map(str, paths), "--json"]) == 0
    lines = capsys.readouterr().out.splitlines()
    objs = [json.loads(line) for line in lines]
    assert [o["architecture"] for o in objs] == ["arch0", "arch1"], f"seed {seed}"
    assert [o["tensor_bytes"] for o in objs] == [3 * 2 * 34, 5 * 2 * 34], f"seed {seed}"

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x07\x00\x00\x00")
    assert cli_main(["inspect", str(paths[0]), str(bad), str(paths[1]), "--json"]) == 2
    out = capsys.readouterr()
    assert [json.loads(line)["architecture"] for line in out.out.splitlines()] == ["arch0", "arch1"]
    assert out.err.count("\n") == 1 and "version 7 is not supported" in out.err


GEMMA_LAYOUT = Path(__file__).resolve().parents[2] / "docs" / "gemma-3-270m-q4_k_m.layout.json"


def _gguf_py_bytes(type_name: str, ne) -> int:
    """A tensor's bytes from gguf-py's block table (not ours)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return math.prod(ne) // block * size


def test_gemma_bytes_per_token_count_the_tied_embedding(gemma_path):
    """Gemma 3 270M has no output.weight: its lm_head reads the whole
    262,144-row embedding every token, so a token reads every tensor of the
    file, sized by gguf-py's block table over the tensor infos that the fuzz
    scanner (independent of gguf_io) reads; gguf-py's own reader takes 18 s
    over this header's 262,144 tokens."""
    from gguf import GGMLQuantizationType
    from ..fuzz.layout import scan
    sizes = {t.name: _gguf_py_bytes(GGMLQuantizationType(t.type_id).name, t.ne)
             for t in scan(gemma_path).tensors}
    assert "output.weight" not in sizes and len(sizes) == 236
    s = summarize(load_gguf(gemma_path))
    assert s.bytes_per_token == sum(sizes.values()) == s.tensor_bytes
    assert sizes["token_embd.weight"] > s.bytes_per_token // 2    # the head is most of a token's reads


@pytest.mark.parametrize("untied", [False, True])
def test_gemma_layout_bytes_per_token(tmp_path, untied):
    """docs/gemma-3-270m-q4_k_m.layout.json written as a sparse file: tied,
    every tensor; with its own lm_head added (Q8_0, as llama-quantize types
    one whose 640-element rows are not whole 256-blocks), the lm_head in full
    and one row of the embedding."""
    from gguf import GGUFValueType
    layout = json.loads(GEMMA_LAYOUT.read_text())
    tensors = [(t["name"], t["type"], tuple(t["ne"])) for t in layout["tensors"]]
    if untied:
        tensors.append(("output.weight", "Q8_0", (640, 262144)))
    path = tmp_path / "gemma-shaped.gguf"
    save_gguf(path, layout["metadata"], {n: (q, None, ne) for n, q, ne in tensors},
              types={k: GGUFValueType(v) for k, v in layout["types"].items()}, progress=False)
    sizes = {n: _gguf_py_bytes(q, ne) for n, q, ne in tensors}
    want = sum(sizes.values())
    if untied:
        want -= sizes["token_embd.weight"] - sizes["token_embd.weight"] // 262144
    s = summarize(load_gguf(path))
    assert s.architecture == "gemma3" and s.tensor_bytes == sum(sizes.values())
    assert s.bytes_per_token == want
