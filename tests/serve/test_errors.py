"""Refusals in OpenAI's error shape, and the server serving on after each:
malformed JSON, fields of the wrong type, a prompt past the context, a
hostile chat template (400), a body over the limit (413), a full queue (503);
a client that disconnects mid-stream frees its slot. Also /v1/models and
/health."""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from muser_torch.text.byte_tokenizer import ByteTokenizer
from muser_torch.text.chat import ChatTemplate
from muser_torch.text.chat_limits import ChatLimits

from .harness import MODEL_ID, greedy, serving, text_of, wait_until

USER = [{"role": "user", "content": "hi"}]


def _error(res: httpx.Response, status: int, param: str | None = None) -> str:
    assert res.status_code == status, res.text
    err = res.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert err["param"] == param and "\n" not in err["message"]
    return err["message"]


def _still_serves(live) -> None:
    # greedy: a sampled answer may draw the end token first (seen once in five runs)
    res = live.client().completions.create(model=MODEL_ID, prompt="x", max_tokens=2, temperature=0)
    assert res.usage.completion_tokens == 2


def test_malformed_bodies_get_400(demo_model):
    with serving(demo_model) as live:
        post = lambda path, body: httpx.post(live.url + path, content=body,  # noqa: E731
                                             headers={"content-type": "application/json"})
        assert "not valid JSON" in _error(post("/v1/chat/completions", b'{"messages": ['), 400)
        assert "not valid JSON" in _error(post("/v1/completions", b"\xff\xfe"), 400)
        assert "JSON object" in _error(post("/v1/completions", b"[]"), 400)
        msg = _error(post("/v1/completions", json.dumps({"prompt": "x", "max_tokens": "9"})),
                     400, "max_tokens")
        assert msg == "max_tokens must be an integer, got a string"
        _still_serves(live)


def test_wrong_field_types_through_the_client_get_400(demo_model):
    with serving(demo_model) as live:
        client = live.client()
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model=MODEL_ID, messages=USER,
                                           extra_body={"temperature": "warm"})
        assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
        with pytest.raises(openai.BadRequestError, match="more than one choice"):
            client.chat.completions.create(model=MODEL_ID, messages=USER, n=2)
        with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.content"):
            client.chat.completions.create(model=MODEL_ID,
                                           messages=[{"role": "user", "content": 5}])
        with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
            client.completions.create(model=MODEL_ID, prompt=[1, 300])
        _still_serves(live)


def test_a_prompt_past_the_context_gets_400(demo_model):
    with serving(demo_model, context=64) as live:
        client = live.client()
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=MODEL_ID, prompt="x" * 63)   # BOS + 63 bytes
        assert "the prompt has 64 tokens, but a slot's context holds 64" in str(e.value)
        with pytest.raises(openai.BadRequestError, match="context holds 64"):
            client.chat.completions.create(model=MODEL_ID,
                                           messages=[{"role": "user", "content": "y" * 60}])
        fits = client.completions.create(model=MODEL_ID, prompt="x" * 62,   # room for one
                                         temperature=0)
        assert fits.usage.completion_tokens == 1 and fits.choices[0].finish_reason == "length"


def test_a_body_over_the_limit_gets_413(demo_model):
    with serving(demo_model, max_body=1000) as live:
        res = httpx.post(live.url + "/v1/completions", json={"prompt": "x" * 2000})
        assert "over 1000" in _error(res, 413)
        _still_serves(live)


class _Templated(ByteTokenizer):
    """The byte tokenizer with a chat template, as a file would carry one."""

    def __init__(self, template: str) -> None:
        self.chat_template = template

    def apply_chat_template(self, messages, add_generation_prompt=True, limits=None):
        return ChatTemplate(self.chat_template, {}, limits).render(
            messages, add_generation_prompt=add_generation_prompt, limits=limits)


HOSTILE = {
    "time": "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
    "size": "{{ 'x' * 3000000000 }}",
    "raises": "{{ raise_exception('no system messages') }}",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_chat_template_gets_400(demo_model, monkeypatch, name):
    monkeypatch.setattr(demo_model, "tokenizer", _Templated(HOSTILE[name]))
    with serving(demo_model, limits=ChatLimits(seconds=0.5)) as live:
        res = httpx.post(live.url + "/v1/chat/completions", json={"messages": USER},
                         timeout=300)
        assert "chat template refused" in _error(res, 400, "messages")
        _still_serves(live)


def test_the_files_template_renders_the_prompt(demo_model, monkeypatch):
    template = ("{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
                "{% if add_generation_prompt %}[assistant] {% endif %}")
    tok = _Templated(template)
    ids = tok.encode("[user] hi\n[assistant] ", bos=False)
    want = text_of(demo_model, greedy(demo_model, ids, 10))
    monkeypatch.setattr(demo_model, "tokenizer", tok)
    with serving(demo_model) as live:
        res = live.client().chat.completions.create(model=MODEL_ID, messages=USER,
                                                    max_tokens=10, temperature=0)
    assert res.usage.prompt_tokens == len(ids) and res.choices[0].message.content == want


def test_past_the_queue_the_server_answers_503(demo_model):
    with serving(demo_model, slots=1, queue=1, start=False) as live:
        client = live.client()
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(client.completions.create, model=MODEL_ID, prompt="a",
                                  max_tokens=3, temperature=0)
            wait_until(lambda: live.scheduler.load()["queued"] == 1, "a queued request")
            res = httpx.post(live.url + "/v1/completions", json={"prompt": "b"})
            assert "busy" in _error(res, 503)
            with pytest.raises(openai.InternalServerError) as e:
                client.chat.completions.create(model=MODEL_ID, messages=USER)
            assert e.value.status_code == 503
            live.scheduler.start()
            assert waiting.result().usage.completion_tokens == 3
        _still_serves(live)


def test_a_client_gone_mid_stream_frees_its_slot(demo_model):
    with serving(demo_model, slots=1) as live:
        body = {"prompt": "def ", "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=300) as r:
            first = next(line for line in r.iter_lines() if line.startswith("data: "))
            assert json.loads(first[len("data: "):])["object"] == "text_completion"
        # leaving the block closed the connection after one chunk of 400
        stats = live.scheduler.stats
        wait_until(lambda: stats.cancelled + stats.finished >= 1, "the stream's end")
        assert (stats.cancelled, stats.finished) == (1, 0)
        wait_until(lambda: live.scheduler.load()["slots_idle"] == 1, "the slot's release")
        _still_serves(live)


def test_models_and_health(demo_model):
    with serving(demo_model, slots=3, context=256) as live:
        models = live.client().models.list().data
        health = httpx.get(live.url + "/health").json()
        missing = httpx.get(live.url + "/v1/nothing")
    assert [m.id for m in models] == [MODEL_ID] and models[0].owned_by == "muser-torch"
    assert models[0].meta == {"n_ctx": 256, "n_ctx_train": 512, "n_vocab": 258, "slots": 3}
    assert health == {"status": "ok", "slots_idle": 3, "slots_processing": 0, "queued": 0}
    _error(missing, 404)


def test_a_client_gone_before_its_whole_answer_cancels_its_job(demo_model):
    with serving(demo_model, slots=1, start=False) as live:
        with pytest.raises(httpx.ReadTimeout):   # the client gives up while the job waits
            httpx.post(live.url + "/v1/completions", json={"prompt": "def ", "temperature": 0},
                       timeout=httpx.Timeout(300, read=0.5))
        queued = list(live.scheduler._waiting)
        assert len(queued) == 1
        wait_until(lambda: all(job.cancelled for job in queued), "the disconnect's notice")
        live.scheduler.start()
        stats = live.scheduler.stats
        wait_until(lambda: stats.cancelled + stats.finished >= 1, "the job's end")
        assert (stats.cancelled, stats.finished) == (1, 0)
        _still_serves(live)
