"""Every file ``convert`` writes runs: for each architecture and each
``--type`` it takes, a tiny random checkpoint is converted, loaded with
``from_gguf`` and run by ``muser-torch run``, and its logits are those of an
independent reference: transformers' own class holding the file's weights
dequantized in float64 by gguf-py (NVFP4 from its bit definition), the
converter's edits undone (``round_trip.py``). The same class on the
checkpoint itself bounds how far the type moved the model. The Muser lanes are
Muse Glimmer's (``Architecture.lanes``): the other architectures refuse them
before reading a tensor. The default suite runs one type per architecture;
``MUSER_SLOW_TESTS=1`` runs every pair."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

import muser_torch  # noqa: E402
from muser_torch.arch import ARCHITECTURES  # noqa: E402
from muser_torch.cli import main as cli_main  # noqa: E402
from muser_torch.convert import TYPES, RecipeError, convert  # noqa: E402
from muser_torch.convert import checkpoint as checkpoint_module  # noqa: E402
from muser_torch.convert.recipes import LOOKUP_KINDS  # noqa: E402

from ..gguf.helpers import fresh_seed  # noqa: E402
from .checkpoints import write_nvfp4_checkpoint  # noqa: E402
from .round_trip import ARCHS, BPE, hf_weights, reference_model, source_model, write_tiny  # noqa: E402

PAIRS = [(a, t) for a in ARCHS for t in TYPES if t in ("f16", "bf16", "q8_0", "q4_k_m", "q3_k_m", "q2_k")
         or t in LOOKUP_KINDS or t in ARCHITECTURES[a].lanes]
REFUSED = [(a, t) for a in ARCHS for t in TYPES if (a, t) not in PAIRS]
# the pair of each architecture the default suite runs
DEFAULT = {"llama": "q8_0", "qwen2": "f16", "qwen3": "bf16", "gemma3": "q4_k_m", "muse-glimmer": "nvfp4"}
# how far from the checkpoint's own logits a type may move a tiny random model
# (relative, Frobenius); measured at most 7e-7, 5e-2 and 0.53, q3_k_m 0.75 and
# q2_k 0.99 (10 seeds): an unrelated model is ~1.4
FROM_SOURCE = {"f16": 1e-4, "bf16": 1e-4, "q8_0": 0.15, "q4_k_m": 1.0, "q4_k_xl": 1.0, "nvfp4": 1.0,
               "q3_k_m": 1.0, "q2_k": 1.25, "iq4_xs": 1.0, "iq4_nl": 1.0, "mxfp4": 0.15}
PROMPT, NEW = 12, 4     # tokens: past the 6-token sliding windows of Gemma 3 and Muse Glimmer


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """arch -> (directory, config, seed), written on first use."""
    root = tmp_path_factory.mktemp("round_trip")
    made = {}

    def get(arch: str):
        if arch not in made:
            seed = fresh_seed()
            made[arch] = (*write_tiny(root / arch, arch, seed), seed)
        return made[arch]
    return get


def _params(pairs):
    return [pytest.param(a, t, id=f"{a}-{t}", marks=() if DEFAULT[a] == t else pytest.mark.slow)
            for a, t in pairs]


@pytest.mark.parametrize("arch,kind", _params(PAIRS))
def test_converted_file_loads_runs_and_matches_the_reference(checkpoints, tmp_path, arch, kind, capsys):
    d, cfg, seed = checkpoints(arch)
    out = tmp_path / f"{arch}-{kind}.gguf"
    convert(d, out, kind, progress=False, pre_tokenizer="qwen2" if arch in BPE else None)
    model = muser_torch.from_gguf(out, dtype=torch.float32)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (PROMPT,), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        first = model(ids[None])[0]
    reference = reference_model(d, arch, cfg, hf_weights(out, arch, cfg))
    want = reference(ids)
    err = _rel(first, want)
    assert err < 1e-4, f"seed {seed}: {arch} {kind} logits are {err:.2e} from the reference"
    assert float(want.std()) > 0.1, f"seed {seed}: degenerate reference logits"
    moved = _rel(want, source_model(d, arch, cfg)(ids))
    assert moved < FROM_SOURCE[kind], f"seed {seed}: {kind} moved the logits by {moved:.2e}"

    # greedy generation: each new token is the reference's argmax (up to a
    # gap far below its distance from the runner-up's typical logit)
    seq = model.generate(ids, NEW, temperature=0, stop=[])
    assert seq.shape == (PROMPT + NEW,) and torch.equal(seq[:PROMPT], ids)
    steps = reference(seq)[PROMPT - 1:-1]
    chosen = steps.gather(1, seq[PROMPT:, None].long())[:, 0]
    gap = steps.max(-1).values - chosen
    assert bool((gap <= 1e-4 * steps.std(-1)).all()), f"seed {seed}: greedy tokens off by {gap.tolist()}"

    # and muser-torch run streams a continuation through the file's tokenizer
    capsys.readouterr()
    rc = cli_main(["run", str(out), "--prompt", "def main(", "--max-new-tokens", "3",
                   "--temperature", "0"])
    captured = capsys.readouterr()
    assert rc == 0 and captured.out.startswith("def main("), captured.err


@pytest.mark.parametrize("arch,kind", [pytest.param(a, t, id=f"{a}-{t}") for a, t in REFUSED])
def test_a_lane_the_architecture_lacks_is_refused_before_reading(checkpoints, tmp_path, monkeypatch,
                                                                   arch, kind, capsys):
    d, _, _ = checkpoints(arch)

    def read(*args):
        raise AssertionError("a tensor was read before the type was refused")
    monkeypatch.setattr(checkpoint_module.Checkpoint, "load", read)
    out = tmp_path / "x.gguf"
    with pytest.raises(RecipeError, match=f"--type {kind} is a Muser lane"):
        convert(d, out, kind, progress=False, pre_tokenizer="qwen2")
    assert cli_main(["convert", str(d), str(out), "--type", kind, "--pre-tokenizer", "qwen2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "f16, bf16, q8_0, q4_k_m" in err, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_nvfp4_checkpoint_of_an_architecture_without_the_lane_is_refused(tmp_path, arch):
    d, _, _ = write_nvfp4_checkpoint(tmp_path / arch, arch, fresh_seed(), n_layers=1,
                                     head_dim=64 if arch == "qwen3" else None)
    for kind in ("nvfp4", "f16"):
        with pytest.raises(RecipeError, match="converts only to the nvfp4 lane.*no Muser lane"):
            convert(d, tmp_path / "x.gguf", kind, progress=False, pre_tokenizer="qwen2")
    assert not (tmp_path / "x.gguf").exists()
