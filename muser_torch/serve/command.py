"""``muser-torch serve FILE.gguf``: load the model, start the decode loop and
serve the OpenAI API with uvicorn until interrupted."""
from __future__ import annotations

import argparse
import importlib
import os
import socket
import sys
from pathlib import Path

from ..run import (add_chat_limit_args, add_dtype_arg, add_engine_arg, add_numerics_arg,
                   add_threads_arg,
                   chat_limits, draft_path, load_draft, load_model, model_path, resolve_device)
from ..text import requirements
DEFAULT_SLOTS = 4
DEFAULT_QUEUE = 64
DEFAULT_CTX = 4096
API_KEY_VARIABLE = "MUSER_API_KEY"
LOOPBACK = ("127.0.0.1", "::1", "localhost")


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server on a GGUF model")
    p.add_argument("model", type=Path, help="GGUF file")
    p.add_argument("--device", default="cpu", help="cpu, mps or cuda")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free one)")
    p.add_argument("--slots", type=int, default=None,
                   help=f"requests decoded together, one KV cache slot each (default {DEFAULT_SLOTS}; "
                        "1 with --draft, which decodes one request at a time)")
    p.add_argument("--draft", type=Path, default=None, metavar="DRAFT",
                   help="a DFlash draft GGUF for MODEL: speculative decoding, one request at a "
                        "time (no logprobs)")
    p.add_argument("--mmproj", type=Path, default=None, metavar="MMPROJ",
                   help="the model's vision projector (llama.cpp's mmproj GGUF; Muse Glimmer): chat "
                        "messages then take image_url parts (data: URLs) and video_url parts "
                        "(frames as data:video/jpeg;base64,<frame>,<frame>,...; no video codec)")
    p.add_argument("--queue", type=int, default=DEFAULT_QUEUE,
                   help="requests that may wait for a slot; past it the server answers 503 "
                        f"(default {DEFAULT_QUEUE})")
    p.add_argument("--ctx-size", type=int, default=DEFAULT_CTX,
                   help="tokens of context per slot, prompt and answer together (default "
                        f"{DEFAULT_CTX}, at most the model's context length)")
    p.add_argument("--alias", default=None, help="the model's id in the API (default: the file name)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every /v1 request (default: "
                        f"${API_KEY_VARIABLE}, which keeps the key out of ps; none: no key)")
    add_dtype_arg(p)
    add_numerics_arg(p)
    add_engine_arg(p)
    add_threads_arg(p)
    add_chat_limit_args(p)
    p.set_defaults(func=main)


def require_extra() -> None:
    """Refuse (``MissingExtraError``) unless every package of the serve extra imports."""
    for module, extra in requirements.EXTRAS.items():
        if extra == "serve":
            try:
                importlib.import_module(module)
            except ImportError:
                raise requirements.missing(module, "serve") from None


def check_args(args: argparse.Namespace) -> None:
    if args.slots is None:
        args.slots = 1 if args.draft is not None else DEFAULT_SLOTS
    if args.draft is not None and args.slots != 1:
        raise ValueError(f"--draft decodes one request at a time: use --slots 1, not {args.slots}")
    if args.draft is not None:
        draft_path(args.draft)
    if args.slots < 1:
        raise ValueError(f"--slots must be >= 1, got {args.slots}")
    if args.queue < 0:
        raise ValueError(f"--queue must be >= 0, got {args.queue}")
    if args.ctx_size < 2:
        raise ValueError(f"--ctx-size must be >= 2 (a prompt token and a new one), got {args.ctx_size}")
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.api_key is None:
        args.api_key = os.environ.get(API_KEY_VARIABLE) or None
    if args.api_key is not None and (not args.api_key.strip() or args.api_key != args.api_key.strip()):
        raise ValueError("--api-key: the key must not be empty or begin or end with white space")


def open_to_others(host: str, api_key: str | None) -> str | None:
    """The warning for serving an address other hosts can reach without a key."""
    if api_key is not None or host in LOOPBACK or host.startswith("127."):
        return None
    return (f"listening on {host} without an API key: anyone who reaches the port can use the "
            f"model (--api-key KEY, or ${API_KEY_VARIABLE})")


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv4 or IPv6)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as e:
        raise OSError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def main(args: argparse.Namespace) -> int:
    require_extra()
    check_args(args)
    limits = chat_limits(args)
    path = model_path(args.model, "q4_k_xl")
    device = resolve_device(args.device)
    sock = listen(args.host, args.port)     # a taken port fails before the model loads

    import uvicorn

    from .app import create_app
    from .scheduler import Scheduler

    model = load_model(path, device, args, command="serve")
    draft = None if args.draft is None else load_draft(args.draft, model, args)
    scheduler = Scheduler(model, args.slots, args.queue, args.ctx_size, draft=draft,
                          engine=args.engine)
    app = create_app(scheduler, args.alias or path.name, limits, api_key=args.api_key)
    warning = open_to_others(args.host, args.api_key)
    if warning:
        print(f"muser-torch serve: WARNING: {warning}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info", timeout_graceful_shutdown=5))
    host, port = sock.getsockname()[:2]
    print(f"muser-torch serve: {path.name} on http://{_url_host(host)}:{port}/v1 ({device}, "
          f"{args.slots} slots of {scheduler.context} tokens, queue {args.queue}"
          f"{f', draft {args.draft.name}' if draft is not None else ''})",
          file=sys.stderr, flush=True)
    scheduler.start()
    try:
        server.run(sockets=[sock])
    finally:
        scheduler.stop()
        sock.close()
    return 0


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
