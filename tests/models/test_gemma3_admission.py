"""Gemma 3 admission fails closed, on small random Gemma 3 files built from
the architecture's own table: each refusal is a typed GGUFError naming the
key or tensor; the tied and untied lm_heads and the final soft-cap work."""
from __future__ import annotations

import pytest
import torch
from gguf.constants import GGMLQuantizationType, GGUFValueType as V
from gguf.quants import dequantize as gguf_dequantize

import muser_torch
from muser_torch.arch.gemma3 import GEMMA3, Gemma3Config
from muser_torch.arch.spec import Role, expand
from muser_torch.errors import (DtypeFenceError, GGUFError, MetadataError, ShapeMismatchError,
                                TensorSetError)
from muser_torch.formats import GGMLType, random_weight
from muser_torch.gguf_io import save_gguf

from ..bounds import check_bound
from .conftest import SEED, rel_err

SMALL = Gemma3Config(context_length=64, hidden=256, ffn=512, n_layers=2, n_heads=2, n_kv_heads=1,
                     head_dim=128, rms_eps=1e-6, sliding_window=16, vocab_size=96,
                     sliding_window_pattern=2)
# types as llama.cpp's Q4_K_M mixes them
TYPES = {"attn_q": GGMLType.Q5_0, "attn_k": GGMLType.Q5_0, "attn_v": GGMLType.Q8_0,
         "attn_output": GGMLType.Q4_K, "ffn_gate": GGMLType.Q5_0, "ffn_up": GGMLType.Q5_0,
         "ffn_down": GGMLType.Q6_K, "token_embd": GGMLType.Q8_0, "output": GGMLType.Q6_K}


def metadata(cfg: Gemma3Config) -> dict:
    p = "gemma3."
    return {"general.architecture": "gemma3", p + "context_length": cfg.context_length,
            p + "embedding_length": cfg.hidden, p + "feed_forward_length": cfg.ffn,
            p + "block_count": cfg.n_layers, p + "attention.head_count": cfg.n_heads,
            p + "attention.head_count_kv": cfg.n_kv_heads, p + "attention.key_length": cfg.head_dim,
            p + "attention.value_length": cfg.head_dim,
            p + "attention.layer_norm_rms_epsilon": cfg.rms_eps,
            p + "attention.sliding_window": cfg.sliding_window,
            p + "attention.sliding_window_pattern": cfg.sliding_window_pattern,
            p + "rope.freq_base": cfg.rope_base, p + "vocab_size": cfg.vocab_size}


def tensors(cfg: Gemma3Config, untied: bool = False) -> dict:
    g = torch.Generator().manual_seed(SEED)
    out = {}
    for name, (spec, _) in expand(GEMMA3, cfg, {"output"} if untied else ()).items():
        ne = spec.shape(cfg)
        if spec.role is Role.NORM:
            out[name] = (GGMLType.F32, 1 + 0.1 * torch.randn(ne[0], generator=g))
        else:
            qtype = TYPES[name.split(".")[-2]]
            std = 1.0 if spec.role is Role.EMBEDDING else ne[0] ** -0.5
            w = random_weight(qtype, ne[1], ne[0], generator=g, std=std)
            out[name] = (qtype, w.packed, ne)
    return out


def write(path, md=None, ts=None, types=None) -> str:
    save_gguf(path, metadata(SMALL) if md is None else md, tensors(SMALL) if ts is None else ts,
              types=types, progress=False)
    return str(path)


def _md(key, value, vtype=None):
    def edit(md, ts, types):
        md[key] = value
        if vtype is not None:
            types[key] = vtype
    return edit


def _drop(name):
    return lambda md, ts, types: ts.pop(name)


def _set(name, spec):
    def edit(md, ts, types):
        ts[name] = spec
    return edit


def _random(qtype, n_out, n_in):
    w = random_weight(qtype, n_out, n_in, generator=torch.Generator().manual_seed(SEED))
    return (qtype, w.packed, (n_in, n_out))


CASES = {
    "unsupported architecture": (_md("general.architecture", "mamba"), MetadataError,
                                 "'mamba', which muser-torch does not run; supported: 'dflash', 'gemma3', 'llama', 'muse-glimmer'"),
    "u32-max layers": (_md("gemma3.block_count", 4294967295, V.UINT32), MetadataError,
                       "gemma3.block_count"),
    "a million layers": (_md("gemma3.block_count", 1_000_000, V.UINT32), MetadataError,
                         "gemma3.block_count is 1000000, but the file holds"),
    "1e308 window": (_md("gemma3.attention.sliding_window", 1e308, V.FLOAT64), MetadataError,
                     "gemma3.attention.sliding_window"),
    "heads not a multiple": (_md("gemma3.attention.head_count_kv", 3), MetadataError,
                             "head_count 2 is not a multiple of head_count_kv 3"),
    "value length": (_md("gemma3.attention.value_length", 64), MetadataError, "value_length"),
    "yarn scaling": (_md("gemma3.rope.scaling.type", "yarn"), MetadataError,
                     "rope.scaling.type is 'yarn'"),
    "NaN softcap": (_md("gemma3.final_logit_softcapping", float("nan")), MetadataError,
                    "final_logit_softcapping"),
    "zero pattern": (_md("gemma3.attention.sliding_window_pattern", 0), MetadataError,
                     "sliding_window_pattern is 0"),
    "missing key": (lambda md, ts, types: md.pop("gemma3.attention.sliding_window"), MetadataError,
                    "'gemma3.attention.sliding_window' is missing"),
    "missing tensor": (_drop("blk.1.post_ffw_norm.weight"), TensorSetError,
                       "blk.1.post_ffw_norm.weight"),
    "extra tensor": (_set("rope_freqs.weight", (GGMLType.F32, torch.ones(64))), TensorSetError,
                     "rope_freqs.weight"),
    "Q8_0 norm": (_set("blk.0.attn_q_norm.weight", _random(GGMLType.Q8_0, 1, 128)), DtypeFenceError,
                  "blk.0.attn_q_norm.weight"),
    "llama.cpp NVFP4 projection": (_set("blk.0.ffn_up.weight", _random(GGMLType.NVFP4, 512, 256)),
                                   DtypeFenceError, "blk.0.ffn_up.weight"),
    "untied lm_head shape": (_set("output.weight", _random(GGMLType.Q6_K, 95, 256)),
                             ShapeMismatchError, "output.weight"),
    "q norm shape": (_set("blk.1.attn_q_norm.weight", (GGMLType.F32, torch.ones(64))),
                     ShapeMismatchError, "head_dim 128"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refuses_bad_gemma3_file(tmp_path, case):
    edit, error, match = CASES[case]
    md, ts, types = metadata(SMALL), tensors(SMALL), {}
    edit(md, ts, types)
    path = write(tmp_path / "bad.gguf", md, ts, types)
    with pytest.raises(error) as info:
        muser_torch.from_gguf(path)
    assert match in str(info.value), f"{case}: {info.value} (seed {SEED})"
    assert isinstance(info.value, GGUFError)


def test_tied_and_untied_lm_heads(tmp_path):
    """Without ``output.weight`` the lm_head multiplies by the embedding's
    bytes; with it, by its own. Either way the logits are the final hidden
    state times gguf's own dequantization of that tensor."""
    for untied in (False, True):
        ts = tensors(SMALL, untied=untied)
        model = muser_torch.from_gguf(write(tmp_path / f"{untied}.gguf", ts=ts), dtype=torch.float32)
        head = "output.weight" if untied else "token_embd.weight"
        qtype, packed, ne = ts[head]
        assert model.output.qtype == qtype and torch.equal(model.output.packed, packed)
        tied_bytes = model.output.packed.data_ptr() == model.tok_embeddings.packed.data_ptr()
        assert tied_bytes != untied
        hidden = []
        model.norm.register_forward_hook(lambda mod, args, out: hidden.append(out))
        ids = torch.randint(0, SMALL.vocab_size, (1, 9), generator=torch.Generator().manual_seed(SEED))
        with torch.no_grad():
            logits = model(ids)
        w = torch.from_numpy(gguf_dequantize(packed.numpy(), GGMLQuantizationType(int(qtype))))
        want = hidden[0].double() @ w.reshape(ne[1], ne[0]).double().T
        err = rel_err(logits, want)
        check_bound("logits: rel err", err, 1e-5, f"untied={untied}: {err:.2e} (seed {SEED})")


def test_final_softcap_caps_the_logits(tmp_path):
    """With ``final_logit_softcapping`` set, logits are cap * tanh(raw / cap)
    of the same model's raw logits."""
    plain = muser_torch.from_gguf(write(tmp_path / "plain.gguf"), dtype=torch.float32)
    md = metadata(SMALL) | {"gemma3.final_logit_softcapping": 3.0}
    capped = muser_torch.from_gguf(write(tmp_path / "capped.gguf", md=md), dtype=torch.float32)
    ids = torch.randint(0, SMALL.vocab_size, (2, 7), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        raw, got = plain(ids), capped(ids)
    assert float(raw.abs().max()) > 3.0, f"raw logits never reach the cap (seed {SEED})"
    err = rel_err(got, 3.0 * torch.tanh(raw.double() / 3.0))
    assert err < 1e-6 and float(got.abs().max()) <= 3.0, f"{err:.2e} (seed {SEED})"


def test_a_window_past_the_context_is_global(tmp_path):
    """A sliding window wider than the context (a checkpoint may say so, and
    llama.cpp's converter writes it) is admitted and attends to every
    position: the logits are those of a window equal to the context."""
    paths = {w: write(tmp_path / f"w{w}.gguf", md=metadata(SMALL) | {"gemma3.attention.sliding_window": w})
             for w in (SMALL.context_length, 10 * SMALL.context_length)}
    ids = torch.randint(0, SMALL.vocab_size, (1, 40), generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        wide, exact = (muser_torch.from_gguf(p, dtype=torch.float32)(ids) for p in paths.values())
        narrow = muser_torch.from_gguf(write(tmp_path / "w16.gguf"), dtype=torch.float32)(ids)
    assert torch.equal(wide, exact), f"seed {SEED}"
    assert rel_err(narrow, exact) > 1e-3, f"the window of 16 changes nothing in 40 tokens (seed {SEED})"
