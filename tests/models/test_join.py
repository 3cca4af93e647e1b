"""Joined projections (``parts.join_projections``, done at load on CUDA): one
packed matrix for q/k/v(/gate) and for gate/up gives the separate matrices'
logits, keeps the bytes once, and is skipped where the types differ. Run on
the CPU here (the join is device-independent arithmetic); the CUDA path runs
it at load (tests/models/test_cuda_models.py)."""
from __future__ import annotations

import pytest
import torch

import muser_torch
from muser_torch.models.parts import Attention, GatedMLP, join_projections

from .hf_files import write_random_gguf


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("arch,types", [("llama", ("Q4_K",)), ("qwen2", ("Q8_0",)),
                                        ("qwen3", ("Q5_0", "Q6_K"))])
def test_join_keeps_logits_and_bytes(tmp_path, arch, types):
    path = write_random_gguf(tmp_path / "m.gguf", arch, seed=3, types=types, n_layers=2)
    model = muser_torch.from_gguf(path, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = model(ids)
    bytes_before = model.weight_bytes_per_token()
    joined = join_projections(model)
    attn = [m for m in model.modules() if isinstance(m, Attention)]
    mlps = [m for m in model.modules() if isinstance(m, GatedMLP)]
    if len(types) == 1:   # every projection joined, and its parts view the joined bytes
        assert joined == len(attn) + len(mlps)
        a = attn[0]
        qkv = a.joined.groups[0]
        assert a.joined.members[0] == ("wq", "wk", "wv")
        assert a.wq.packed.data_ptr() == qkv.packed.data_ptr()
        assert qkv.n_out == a.wq.n_out + a.wk.n_out + a.wv.n_out
    else:
        assert joined >= 1
    with torch.no_grad():
        got = model(ids)
    assert _rel(got, want) < 1e-6
    assert model.weight_bytes_per_token() == bytes_before


def test_join_groups_by_type(tmp_path):
    path = write_random_gguf(tmp_path / "m.gguf", "llama", seed=4, n_layers=1,
                             type_of={"blk.0.attn_q.weight": "Q4_K", "blk.0.attn_k.weight": "Q8_0",
                                      "blk.0.attn_v.weight": "Q4_K", "blk.0.ffn_gate.weight": "Q4_K",
                                      "blk.0.ffn_up.weight": "Q8_0"})
    model = muser_torch.from_gguf(path, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids)
    attn = next(m for m in model.modules() if isinstance(m, Attention))
    mlp = next(m for m in model.modules() if isinstance(m, GatedMLP))
    assert attn.join_projections() == 1 and attn.joined.members == [("wq", "wv")]
    assert mlp.join_projections() == 0
    with torch.no_grad():
        assert _rel(model(ids), want) < 1e-6


def test_long_inputs_run_the_parts(tmp_path):
    """Past JOIN_MAX_TOKENS rows the parts run alone, with the same logits."""
    from muser_torch.models import parts
    path = write_random_gguf(tmp_path / "m.gguf", "llama", seed=5, types=("Q8_0",), n_layers=1)
    model = muser_torch.from_gguf(path, device="cpu", dtype=torch.float32)
    ids = torch.randint(0, model.config.vocab_size, (1, parts.JOIN_MAX_TOKENS + 3),
                        generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model(ids)
    join_projections(model)
    calls = []
    for joined in (m for m in model.modules() if isinstance(m, parts.JoinedProjections)):
        for g in joined.groups:
            g.register_forward_hook(lambda *a: calls.append(1))
    with torch.no_grad():
        got_long = model(ids)
        assert not calls
        model(ids[:, :parts.JOIN_MAX_TOKENS])
        assert calls
    assert _rel(got_long, want) < 1e-6
