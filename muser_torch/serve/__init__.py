"""``muser-torch serve``: an OpenAI-compatible HTTP server on a GGUF model
(``docs/serve.md``). One module per job: ``schemas`` (request fields and
their rules), ``prompts`` (messages and prompts to ids; the default chat
template), ``sampling`` (one request's token choice and stop strings),
``scheduler`` (the decode loop batching requests over the cache's slots),
``responses`` (OpenAI's response bodies), ``grammar`` (the token mask of a
JSON schema or a tool call), ``tools`` (the forms of tool calls and their
grammar), ``tool_calls`` (an answer's calls parsed), ``app`` (the routes) and
``command`` (the CLI). Needs the ``serve`` extra (FastAPI, uvicorn,
sse-starlette); nothing here imports them until a server is made."""
from __future__ import annotations


def register(subparsers) -> None:
    from .command import register as _register
    _register(subparsers)
