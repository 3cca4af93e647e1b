"""The HTTP application: FastAPI routes over one ``Scheduler``.

``POST /v1/chat/completions`` and ``POST /v1/completions`` (whole, or as
server-sent events with ``"stream": true``), ``GET /v1/models`` and
``GET /health``. A chat may offer tools (``tools.py``: the form the
template's family writes; ``tool_calls.py``: the answer parsed into calls).
Every error is OpenAI's shape, ``{"error": {"message",
"type", "param", "code"}}``: 400 for a bad body (``schemas``), a prompt
past the context or a chat template that fails; 401 for a ``/v1`` request
without the server's API key (when it has one); 413 for a body over
``max_body`` bytes; 503 when the queue is full; 500 when decoding fails.

A request's events come from the scheduler thread through
``loop.call_soon_threadsafe`` into an ``asyncio.Queue`` of its own.

A chat's ``image_url`` and ``video_url`` parts (``data:`` URLs only; a video
as its frames, ``data:video/jpeg;base64,<frame>,...``, at ``media_io_kwargs``'
``video.fps``) become image and video rows at their placeholders
(``prompts.visual_prompt``), computed on the request's thread before the job is
queued; a model without a vision projector (``serve --mmproj``) answers them
with a 400. When
its client disconnects (a stream: sse-starlette ends the generator; a whole
response: a watcher of ``http.disconnect``) the job is cancelled, and the
scheduler frees its slot at its next turn.
"""
from __future__ import annotations

import asyncio
import functools
import hmac
import json
import time
from dataclasses import replace
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from sse_starlette import EventSourceResponse
from starlette.exceptions import HTTPException

from ..text.chat_limits import ChatLimits
from .grammar import Grammars
from .prompts import chat_prompt, completion_prompt, visual_prompt
from .responses import Reply, TokenText, error_body
from .scheduler import Failure, Finish, Job, Piece, QueueFull, Scheduler
from .schemas import (ChatRequest, CompletionRequest, RequestError, ToolRequest, chat_request,
                      completion_request, parse_json)
from .tool_calls import CallParser
from .tools import Family, family_of, tool_grammar

MAX_BODY_BYTES = 16 << 20
PING_SECONDS = 15


def create_app(scheduler: Scheduler, model_id: str, chat_limits: ChatLimits | None = None,
               max_body: int = MAX_BODY_BYTES, api_key: str | None = None) -> FastAPI:
    """The app serving ``scheduler``'s model as ``model_id``; the caller starts
    and stops the scheduler. With ``api_key``, every ``/v1`` request must
    carry ``Authorization: Bearer <api_key>`` (else a 401); ``/health`` stays open."""
    app = FastAPI(title="muser-torch", docs_url=None, redoc_url=None, openapi_url=None)
    if api_key is not None:
        _require_key(app, api_key)
    limits = chat_limits or ChatLimits()
    tok = scheduler.tokenizer
    tokens = TokenText(tok)
    vocab_size = scheduler.model.config.vocab_size
    started = int(time.time())

    @functools.cache
    def grammars() -> Grammars:     # the vocabulary's token bytes, made on the first schema
        return Grammars(tok, vocab_size)

    @app.exception_handler(RequestError)
    async def _request_error(_: Request, e: RequestError) -> JSONResponse:
        return JSONResponse(error_body(str(e), e.status, e.param), status_code=e.status)

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, e: HTTPException) -> JSONResponse:
        return JSONResponse(error_body(str(e.detail), e.status_code), status_code=e.status_code)

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", **scheduler.load()}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{
            "id": model_id, "object": "model", "created": started, "owned_by": "muser-torch",
            "meta": {"n_ctx": scheduler.context, "n_ctx_train": scheduler.model.config.context_length,
                     "n_vocab": vocab_size, "slots": scheduler.slots}}]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        req = chat_request(parse_json(await _read_body(request, max_body)))
        family = None
        if req.tools is not None:
            family = family_of(getattr(tok, "chat_template", None))
            if family is None:
                raise RequestError("tools: this model's chat template writes tool calls in no "
                                   "form the server reads (Hermes' <tool_call> JSON, Llama 3's "
                                   "JSON); send tool_choice 'none' or no tools", param="tools")
        offered = req.tools.tools if req.tools is not None else None
        # a chat template is the file's code: rendered off the event loop, within limits
        ids, stops = await asyncio.to_thread(chat_prompt, tok, req.messages, limits, offered)
        embeds = None
        if getattr(req.messages, "visuals", ()):
            ids, embeds = await asyncio.to_thread(visual_prompt, scheduler.model, ids, req.messages.visuals,
                                                  req.video_fps, scheduler.engine_name)
        return await _respond("chat", req, ids, stops, request, "messages", req.tools, family, embeds)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        req = completion_request(parse_json(await _read_body(request, max_body)))
        ids = await asyncio.to_thread(completion_prompt, tok, req.prompt, vocab_size)
        return await _respond("text", req, ids, (), request, "prompt")

    async def _respond(kind: str, req: ChatRequest | CompletionRequest, ids: list[int],
                       stops: tuple[str, ...], request: Request, param: str,
                       tools: ToolRequest | None = None, family: Family | None = None,
                       embeds: Any = None) -> Any:
        if len(ids) >= scheduler.context:
            raise RequestError(f"the prompt has {len(ids)} tokens, but a slot's context holds "
                               f"{scheduler.context} with room for at least one new token",
                               param=param)
        if req.params.logprobs and scheduler.draft is not None:
            raise RequestError("logprobs are not offered by a server with a draft (--draft): "
                               "its rounds accept tokens without a logits row each",
                               param="logprobs")
        constraint = None
        if req.params.json_schema is not None:
            constraint = await asyncio.to_thread(grammars().constraint, req.params.json_schema)
        if tools is not None and tools.constrained:
            constraint = await asyncio.to_thread(_tool_constraint, grammars(), family, tools)
        params = replace(req.params, stop=req.params.stop + stops)
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        job = Job(ids, params, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev),
                  constraint=constraint, embeds=embeds)
        try:
            scheduler.submit(job)
        except QueueFull as e:
            raise RequestError(f"the server is busy: {e}; retry later", status=503) from None
        reply = Reply(kind, model_id, tokens, params.logprobs,
                      calls=None if tools is None else CallParser(family, tools.names))
        if req.stream:
            return EventSourceResponse(_stream(job, events, reply, req.include_usage),
                                       ping=PING_SECONDS)
        return await _whole(job, events, reply, request)

    return app


def _tool_constraint(grammars: Grammars, family: Family, tools: ToolRequest) -> Any:
    """The grammar of an answer of calls only (``tool_choice`` "required" or a function)."""
    return grammars.lark_constraint(tool_grammar(family, tools, grammars.is_special), "tools")


def _require_key(app: FastAPI, api_key: str) -> None:
    """Refuse ``/v1`` requests without the key: OpenAI's 401, the key compared
    in constant time (no timing tells how much of a guess was right)."""
    if not api_key:
        raise ValueError("an API key must not be empty")
    want = f"Bearer {api_key}".encode()

    @app.middleware("http")
    async def _check_key(request: Request, call_next):
        if request.url.path.startswith("/v1"):
            got = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(got, want):
                body = error_body("a valid API key is required: Authorization: Bearer <key>", 401)
                body["error"]["code"] = "invalid_api_key"
                return JSONResponse(body, status_code=401)
        return await call_next(request)


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(f"the request body of {declared} bytes is over {limit}", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(f"the request body is over {limit} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


async def _whole(job: Job, events: asyncio.Queue, reply: Reply, request: Request) -> JSONResponse:
    """Wait for the job's end; a client that disconnects first cancels it."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job, events))
    try:
        while True:
            ev = await events.get()
            if isinstance(ev, Piece):
                reply.add(ev)
            elif isinstance(ev, Finish):
                reply.finish = ev
                return JSONResponse(reply.body())
            elif isinstance(ev, Failure):
                return JSONResponse(error_body(ev.message, 500), status_code=500)
            else:   # the client went away: nobody reads this response
                return JSONResponse(error_body("the client disconnected", 400), status_code=400)
    finally:
        watcher.cancel()
        job.cancel()   # no-op for a finished job; frees the slot of an abandoned one


async def _cancel_on_disconnect(request: Request, job: Job, events: asyncio.Queue) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
    job.cancel()
    events.put_nowait(None)


async def _stream(job: Job, events: asyncio.Queue, reply: Reply,
                  include_usage: bool) -> AsyncIterator[str]:
    """The job's events as SSE data lines, ending in ``[DONE]``. sse-starlette
    cancels this generator when the client disconnects; ``finally`` then
    cancels the job."""
    try:
        first = reply.first_chunk()
        if first is not None:
            yield json.dumps(first)
        while True:
            ev = await events.get()
            if isinstance(ev, Piece):
                for chunk in reply.piece_chunks(ev):
                    yield json.dumps(chunk)
            elif isinstance(ev, Finish):
                for chunk in reply.finish_chunks(ev):
                    yield json.dumps(chunk)
                if include_usage:
                    yield json.dumps(reply.usage_chunk())
                yield "[DONE]"
                return
            else:
                yield json.dumps(error_body(ev.message, 500))
                return
    finally:
        job.cancel()
