"""``--api-key``: every /v1 request needs ``Authorization: Bearer KEY`` (a 401
in OpenAI's shape otherwise, which the ``openai`` client raises as
``AuthenticationError``); /health stays open; the key comes from the flag or
``MUSER_API_KEY``; an empty key is refused; serving a non-loopback address
without a key warns."""
from __future__ import annotations

import secrets

import httpx
import openai
import pytest

from muser_torch.serve.command import open_to_others

from .harness import MODEL_ID, serving
from .test_command import DEMO_FILE, _refused


def test_requests_need_the_key(demo_model):
    key = secrets.token_hex(16)
    with serving(demo_model, api_key=key) as live:
        good = openai.OpenAI(base_url=f"{live.url}/v1", api_key=key, max_retries=0)
        answer = good.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=3, temperature=0)
        assert answer.usage.completion_tokens == 3
        wrong = openai.OpenAI(base_url=f"{live.url}/v1", api_key=key[:-1] + "x", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=3)
        for path, headers in (("/v1/models", {}), ("/v1/models", {"Authorization": key}),
                              ("/v1/models", {"Authorization": f"Bearer {key}x"}),
                              ("/v1/models", {"Authorization": f"Basic {key}"})):
            res = httpx.get(f"{live.url}{path}", headers=headers)
            assert res.status_code == 401, (headers, res.text)
            err = res.json()["error"]
            assert err["code"] == "invalid_api_key" and err["type"] == "invalid_request_error"
            assert key not in res.text
        assert httpx.get(f"{live.url}/health").status_code == 200
        assert httpx.get(f"{live.url}/v1/models",
                         headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_without_a_key_every_request_is_served(demo_model):
    with serving(demo_model) as live:
        assert httpx.get(f"{live.url}/v1/models").status_code == 200


@pytest.mark.parametrize("key", ["", " ", " padded"])
def test_a_blank_or_padded_key_is_refused(capsys, key):
    assert "--api-key: the key must not be empty" in _refused(capsys, [DEMO_FILE, "--port", "0",
                                                                        "--api-key", key])


def test_the_key_variable_is_read(capsys, monkeypatch):
    monkeypatch.setenv("MUSER_API_KEY", " ")
    assert "--api-key: the key must not be empty" in _refused(capsys, [DEMO_FILE, "--port", "0"])


def test_an_open_address_without_a_key_warns():
    assert open_to_others("0.0.0.0", None) is not None
    assert "without an API key" in open_to_others("192.0.2.7", None)
    assert open_to_others("0.0.0.0", "k") is None
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert open_to_others(host, None) is None
