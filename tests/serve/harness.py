"""A server on a free loopback port inside the test process, the official
``openai`` client against it, and the references the answers are held to.

The only waits are hang guards (``HANG_S``): a condition that must come
true is polled, and only a server that hangs runs into the guard."""
from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import openai
import torch
import uvicorn

from muser_torch.serve.app import create_app
from muser_torch.serve.sampling import SamplingParams
from muser_torch.serve.scheduler import Failure, Finish, Job, Piece, Scheduler
from muser_torch.text.chat_limits import ChatLimits

HANG_S = 300.0
MODEL_ID = "test-model"


def wait_until(condition: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + HANG_S
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"hang guard: {what} did not happen within {HANG_S:g} s")
        time.sleep(0.01)


@dataclass
class Live:
    url: str
    scheduler: Scheduler

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0,
                             timeout=HANG_S)


@contextmanager
def serving(model, *, slots: int = 4, queue: int = 16, context: int = 512, start: bool = True,
            limits: ChatLimits | None = None, draft=None, **app_kw) -> Iterator[Live]:
    """The app over a fresh scheduler of ``model``, served on 127.0.0.1 at a
    free port. ``start=False`` leaves the decode loop stopped (requests
    queue up) until the test calls ``live.scheduler.start()``."""
    scheduler = Scheduler(model, slots, queue, context, draft=draft)
    app = create_app(scheduler, MODEL_ID, limits, **app_kw)
    sock = socket.create_server(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    if start:
        scheduler.start()
    thread.start()
    try:
        wait_until(lambda: server.started, "uvicorn's start")
        yield Live(f"http://127.0.0.1:{sock.getsockname()[1]}", scheduler)
    finally:
        server.should_exit = True
        thread.join(HANG_S)
        scheduler.stop()
        sock.close()


def queued_completions(model, prompts: Sequence[str], max_tokens: int, slots: int,
                       context: int = 512) -> tuple[list, int]:
    """Greedy completions of ``prompts`` sent together while the decode loop
    is stopped, so that its first turn takes them all: the client's answers,
    and the largest batch one decode step ran."""
    with serving(model, slots=slots, context=context, start=False) as live:
        client = live.client()
        with ThreadPoolExecutor(len(prompts)) as pool:
            futures = [pool.submit(client.completions.create, model=MODEL_ID, prompt=p,
                                   max_tokens=max_tokens, temperature=0) for p in prompts]
            wait_until(lambda: live.scheduler.load()["queued"] == len(prompts), "queued requests")
            live.scheduler.start()
            return [f.result() for f in futures], live.scheduler.stats.max_batch


def greedy(model, ids: Sequence[int], n: int) -> list[int]:
    """``model.generate``'s greedy new tokens for ``ids``, up to and including
    the first of the tokenizer's stop ids."""
    new = model.generate(torch.tensor(list(ids)), n, temperature=0.0)[len(ids):].tolist()
    stops = set(model.tokenizer.stop_ids)
    end = next((i + 1 for i, t in enumerate(new) if t in stops), len(new))
    return new[:end]


def text_of(model, new: Sequence[int]) -> str:
    """The text of generated ids, the stop token left out."""
    stops = set(model.tokenizer.stop_ids)
    return model.tokenizer.decode([t for t in new if t not in stops])


def chatml(messages: Sequence[dict]) -> str:
    """The default template's prompt, written out by hand (docs/serve.md)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


class Collect:
    """A job's sink: its events, and ``done`` once it ended."""

    def __init__(self, on_piece=None) -> None:
        self.events: list = []
        self.done = threading.Event()
        self.on_piece = on_piece

    def __call__(self, ev) -> None:
        self.events.append(ev)
        if isinstance(ev, (Finish, Failure)):
            self.done.set()
        elif self.on_piece is not None:
            self.on_piece(self)

    def wait(self) -> "Collect":
        assert self.done.wait(HANG_S), "hang guard: the job did not end"
        return self

    @property
    def tokens(self) -> list[int]:
        return [t for ev in self.events if isinstance(ev, Piece) for t in ev.tokens]

    @property
    def pieces(self) -> list[Piece]:
        return [ev for ev in self.events if isinstance(ev, Piece)]

    @property
    def end(self):
        return self.events[-1]


def run_jobs(model, jobs: list[tuple[list[int], SamplingParams]], slots: int, queue: int = 16,
             context: int = 512, draft=None) -> tuple[list[Collect], Scheduler]:
    """Submit every job before the loop starts (so the first turn fills every
    slot), run them to the end, stop the loop."""
    sched = Scheduler(model, slots, queue, context, draft=draft)
    sinks = []
    for ids, params in jobs:
        sinks.append(Collect())
        sched.submit(Job(ids, params, sinks[-1]))
    sched.start()
    try:
        for s in sinks:
            s.wait()
    finally:
        sched.stop()
    return sinks, sched
