"""``muser-torch serve``'s refusals: one line on stderr, exit 2, before any
model loads."""
from __future__ import annotations

import socket

import pytest

from muser_torch.cli import main as cli
from muser_torch.run import DEMO

DEMO_FILE = str(DEMO["q4_k_xl"])


def _refused(capsys, argv: list[str]) -> str:
    assert cli(["serve", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("muser-torch serve: error: ") and "\n" not in err
    return err


@pytest.mark.parametrize("args,message", [
    (["--slots", "0"], "--slots must be >= 1, got 0"),
    (["--queue", "-1"], "--queue must be >= 0, got -1"),
    (["--ctx-size", "1"], "--ctx-size must be >= 2"),
    (["--port", "70000"], "--port must be in [0, 65535], got 70000"),
    (["--chat-template-seconds", "0"], "--chat-template-*: chat template seconds must be"),
    (["--device", "tpu"], "--device must be cpu, mps or cuda"),
    (["--draft", DEMO_FILE, "--slots", "2"], "--draft decodes one request at a time: use --slots 1, not 2"),
    (["--draft", "no-such-draft.gguf"], "--draft no-such-draft.gguf does not exist"),
])
def test_bad_arguments(capsys, args, message):
    assert message in _refused(capsys, [DEMO_FILE, "--port", "0", *args])


def test_missing_file(capsys, tmp_path):
    assert "does not exist" in _refused(capsys, [str(tmp_path / "none.gguf")])


def test_a_taken_port(capsys):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert f"cannot listen on 127.0.0.1:{port}" in _refused(capsys, [DEMO_FILE, "--port",
                                                                         str(port)])
