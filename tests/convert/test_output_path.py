"""The output path is checked before the checkpoint is opened: an existing file
is refused (OutputExistsError, naming the path and --force) unless ``force``,
a directory or a missing folder is refused, and the refusal leaves the
existing file as it was and no ``.partial`` beside it. With ``force`` the file
is replaced by the new one, through the same ``.partial`` rename."""
from __future__ import annotations

import pytest

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from muser_torch import load_gguf  # noqa: E402
from muser_torch.cli import main as cli_main  # noqa: E402
from muser_torch.convert import OutputExistsError, OutputPathError, convert  # noqa: E402
from muser_torch.convert import pipeline  # noqa: E402

from ..gguf.helpers import fresh_seed  # noqa: E402
from .checkpoints import write_checkpoint  # noqa: E402


@pytest.fixture
def garbage_checkpoint(tmp_path, monkeypatch):
    """A directory whose config and safetensors are garbage: any read of it fails;
    opening it at all fails the test."""
    d = tmp_path / "garbage"
    d.mkdir()
    (d / "config.json").write_text("{ not json")
    (d / "model.safetensors").write_bytes(b"\xff" * 4096)

    def opened(*args, **kwargs):
        raise AssertionError("the checkpoint was opened before the output path was checked")
    monkeypatch.setattr(pipeline, "Checkpoint", opened)
    return d


def _nothing_left(out, before: bytes) -> None:
    assert out.read_bytes() == before
    assert sorted(p.name for p in out.parent.iterdir() if p.name != "garbage") == [out.name]


def test_existing_output_is_refused_before_the_checkpoint_is_read(garbage_checkpoint, tmp_path, capsys):
    out = tmp_path / "out.gguf"
    out.write_bytes(b"an earlier file")
    with pytest.raises(OutputExistsError, match=r"out\.gguf exists; pass --force"):
        convert(garbage_checkpoint, out, "q4_k_m")
    _nothing_left(out, b"an earlier file")
    assert cli_main(["convert", str(garbage_checkpoint), str(out), "--type", "nvfp4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("muser-torch convert: error: ") and str(out) in err and "--force" in err
    _nothing_left(out, b"an earlier file")


@pytest.mark.parametrize("force", [False, True])
def test_directory_or_missing_folder_is_refused(garbage_checkpoint, tmp_path, force, capsys):
    folder = tmp_path / "a_folder"
    folder.mkdir()
    with pytest.raises(OutputPathError, match="a_folder is a directory"):
        convert(garbage_checkpoint, folder, "f16", force=force)
    assert list(folder.iterdir()) == []
    lost = tmp_path / "no_such_folder" / "x.gguf"
    with pytest.raises(OutputPathError, match="no_such_folder does not exist"):
        convert(garbage_checkpoint, lost, "f16", force=force)
    argv = ["convert", str(garbage_checkpoint), str(lost)] + (["--force"] if force else [])
    assert cli_main(argv) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not lost.parent.exists()


def test_force_replaces_the_file(tmp_path, capsys):
    d, _, _ = write_checkpoint(tmp_path / "ck", "llama", fresh_seed(), n_layers=1)
    out = tmp_path / "out.gguf"
    out.write_bytes(b"an earlier file")
    r = convert(d, out, "q8_0", progress=False, force=True)
    assert load_gguf(out)["blk.0.attn_q.weight"].type_name == "Q8_0" and r.path == out
    first = out.read_bytes()
    assert cli_main(["convert", str(d), str(out), "--type", "f16", "--no-progress", "--force"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert out.read_bytes() != first and load_gguf(out)["blk.0.attn_q.weight"].type_name == "F16"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "out.gguf"]
    # without --force the same command is refused and the file stays
    assert cli_main(["convert", str(d), str(out), "--type", "q8_0", "--no-progress"]) == 2
    assert "--force" in capsys.readouterr().err
    assert load_gguf(out)["blk.0.attn_q.weight"].type_name == "F16"
