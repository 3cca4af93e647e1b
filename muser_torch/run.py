"""``muser-torch run [MODEL]``: stream a model's continuation of a prompt, or
(``--chat``) answer one chat turn or a conversation typed at the prompt.

MODEL is any GGUF ``muser_torch.from_gguf`` takes (Glimmer, Gemma 3, Llama,
Qwen2/3); with none it runs the bundled demo (``demo/glimmer-demo-q4_k_xl.gguf``,
a byte-level model trained on Python's standard library). ``--chat`` renders
the file's ``tokenizer.chat_template``.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

from .errors import ContextLengthError, DraftMismatchError
from .nn import NUMERICS, check_numerics
from .text.chat_limits import DEFAULT_MAX_CHARS, DEFAULT_SECONDS, MESSAGES_FACTOR, ChatLimits
from .text.stream import TextStream
from .vision.video_files import FRAME_RATE

DEMO_DIR = Path(__file__).resolve().parents[1] / "demo"
DEMO = {"q4_k_xl": DEMO_DIR / "glimmer-demo-q4_k_xl.gguf",
        "nvfp4": DEMO_DIR / "glimmer-demo-nvfp4.gguf"}
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="generate text with a GGUF model (default: the bundled demo)")
    p.add_argument("model", nargs="?", type=Path, default=None,
                   help="GGUF file (default: the bundled demo, demo/glimmer-demo-<lane>.gguf)")
    p.add_argument("--lane", choices=tuple(DEMO), default="q4_k_xl",
                   help="which bundled demo to run when MODEL is not given (default %(default)s)")
    p.add_argument("--prompt", default=None,
                   help="text to continue (default 'def '); with --chat, the user's message "
                        "(without it, --chat reads messages from standard input until EOF)")
    p.add_argument("--chat", action="store_true",
                   help="render the file's chat template around the prompt and answer as the assistant")
    add_chat_limit_args(p)
    p.add_argument("--backend", choices=("native", "metal-emulator"), default="native",
                   help="CPU tensors: the native kernels, or the .metal kernels through the emulator "
                        "(default %(default)s)")
    p.add_argument("--max-new-tokens", type=int, default=200, metavar="N",
                   help="tokens to generate at most (default %(default)s)")
    p.add_argument("--draft", type=Path, default=None, metavar="DRAFT",
                   help="a DFlash draft GGUF for MODEL: speculative decoding (one sequence; the "
                        "text is printed when done, with the draft's mean accepted tokens per round; "
                        "default: none, each token from MODEL alone)")
    p.add_argument("--mmproj", type=Path, default=None, metavar="MMPROJ",
                   help="the model's vision projector (llama.cpp's mmproj GGUF; Muse Glimmer); "
                        "default: none")
    p.add_argument("--image", type=Path, action="append", default=None, metavar="PATH",
                   help="an image placed before the prompt's text (repeatable, in order; needs "
                        "--mmproj; combines with --draft); default: none")
    p.add_argument("--video", type=Path, action="append", default=None, metavar="PATH",
                   help="a video placed before the prompt's text, after the images (repeatable, in "
                        "order; needs --mmproj; combines with --chat and --draft): a folder of frame "
                        "images, sorted by name, at --video-fps; or an animated image (GIF, WebP), "
                        "timed by its frames' durations. No video codec is read: extract an mp4's "
                        "frames first (ffmpeg -i clip.mp4 -vf fps=1 frames/%%05d.png); default: none")
    p.add_argument("--video-fps", type=float, default=FRAME_RATE, metavar="F",
                   help="frames per second of a --video folder's frames (and of an animation whose "
                        "frames carry no durations), which gives each frame's time; the model keeps "
                        "2 a second, at most 96 (default %(default)s)")
    p.add_argument("--device", default="cpu", help="cpu, mps or cuda (default %(default)s)")
    add_dtype_arg(p)
    add_numerics_arg(p)
    add_engine_arg(p)
    p.add_argument("--temperature", type=float, default=0.8, metavar="T",
                   help="sampling temperature; 0 is greedy (default %(default)s)")
    p.add_argument("--top-k", type=int, default=None, metavar="K",
                   help="sample among the K most probable tokens only (default: no top-k cut)")
    p.add_argument("--top-p", type=float, default=0.95, metavar="P",
                   help="sample among the most probable tokens whose mass reaches P; 1 keeps all "
                        "(default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sampling (default %(default)s)")
    add_threads_arg(p)
    p.set_defaults(func=main)


def add_chat_limit_args(p) -> None:
    """``--chat-template-seconds`` / ``--chat-template-max-chars`` (read by ``chat_limits``)."""
    p.add_argument("--chat-template-seconds", type=float, default=DEFAULT_SECONDS, metavar="S",
                   help="CPU seconds one render of the file's chat template may take "
                        f"(default {DEFAULT_SECONDS:g})")
    p.add_argument("--chat-template-max-chars", type=int, default=DEFAULT_MAX_CHARS, metavar="N",
                   help="characters the rendered prompt, or any value the template makes, may "
                        f"have (default {DEFAULT_MAX_CHARS:,}, or {MESSAGES_FACTOR} times the "
                        "messages' own size when that is larger)")


def add_dtype_arg(p) -> None:
    p.add_argument("--dtype", choices=("auto", *DTYPES), default="auto",
                   help="activation dtype; auto = from_gguf's default: float32 on CPU (torch's "
                        "CPU float16 matmul is ~30x slower), the architecture's on an "
                        "accelerator (float16; Gemma 3 bfloat16); default %(default)s")


def resolve_dtype(name: str) -> torch.dtype | None:
    """``--dtype``'s dtype; None for ``auto``, which ``from_gguf`` resolves
    (``Decoder.default_dtype``), so the command and the API default alike."""
    return None if name == "auto" else DTYPES[name]


def add_numerics_arg(p) -> None:
    p.add_argument("--numerics", choices=NUMERICS, default=NUMERICS[0],
                   help="projection arithmetic: exact (float activations, matches transformers; "
                        "the default), ggml (8-bit activations as llama.cpp's CPU backend; the "
                        "native CPU kernels only)")


def add_engine_arg(p) -> None:
    from .models.engine import ENGINES
    p.add_argument("--engine", choices=ENGINES, default=ENGINES[0],
                   help="how decode steps run: auto (recorded once and replayed as CUDA graphs "
                        "on CUDA, eager elsewhere; the default), graph (CUDA graphs or an error), "
                        "eager (every kernel launched from Python); with --draft, greedy rounds "
                        "are recorded the same way, and with --mmproj the vision forward (one "
                        "recording per image size)")


def add_threads_arg(p) -> None:
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="CPU threads for torch (default: torch's choice). A small model "
                        "decodes fastest on 1: its ops are too short to amortize waking a pool.")


def apply_threads(n: int | None) -> None:
    if n is not None:
        if n < 1:
            raise ValueError(f"--threads must be >= 1, got {n}")
        torch.set_num_threads(n)


def resolve_device(name: str) -> torch.device:
    try:
        dev = torch.device(name)
    except RuntimeError:  # not a device string at all
        raise ValueError(f"--device must be cpu, mps or cuda, got {name!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError("--device mps: MPS is not available on this machine")
    if dev.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device must be cpu, mps or cuda, got {name!r}")
    return dev


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def model_path(model: Path | None, lane: str) -> Path:
    """``model``, or the bundled demo of ``lane`` when it is None; it must exist."""
    from .gguf_io import check_file
    if model is not None:
        return check_file(model)
    try:
        return check_file(DEMO[lane])
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{e} (the bundled demo ships in the repository's demo/)") from None


def draft_path(draft: Path) -> Path:
    """``--draft``'s file, checked as MODEL is, before anything loads."""
    from .gguf_io import check_file
    try:
        return check_file(draft)
    except OSError as e:
        raise type(e)(f"--draft {e}") from None


def check_sampling_args(args: argparse.Namespace) -> None:
    """Refuse bad generation arguments before anything is loaded or printed."""
    if args.max_new_tokens < 0:
        raise ValueError(f"--max-new-tokens must be >= 0, got {args.max_new_tokens}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    if args.top_k is not None and args.top_k < 1:
        raise ValueError(f"--top-k must be >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {args.top_p}")
    if getattr(args, "chat", False):
        chat_limits(args)


def chat_limits(args: argparse.Namespace) -> ChatLimits:
    """The chat-template bounds of ``--chat-template-seconds`` / ``-max-chars``."""
    try:
        return ChatLimits(seconds=args.chat_template_seconds, max_chars=args.chat_template_max_chars)
    except ValueError as e:
        raise ValueError(f"--chat-template-*: {e}") from None


def check_room(n_prompt: int, max_new_tokens: int, context_length: int) -> None:
    """Refuse a run whose prompt plus new tokens cannot fit the model's context."""
    if n_prompt + max_new_tokens > context_length:
        room = max(context_length - n_prompt, 0)
        raise ContextLengthError(f"--max-new-tokens {max_new_tokens}: the prompt's {n_prompt} tokens "
                                 f"plus {max_new_tokens} new ones make {n_prompt + max_new_tokens}, "
                                 f"more than the model's context length of {context_length} "
                                 f"(at most {room} new tokens fit)", n_prompt + max_new_tokens, context_length)


def load_model(path: Path, device: torch.device, args: argparse.Namespace, command: str = "run"):
    """The model in ``path`` as ``--dtype``, ``--numerics`` and ``--threads``
    ask; it must carry a tokenizer (``command`` needs it)."""
    from .models import from_gguf

    apply_threads(args.threads)
    try:
        model = from_gguf(path, device=device, dtype=resolve_dtype(args.dtype),
                          progress=path.stat().st_size > 256 << 20, numerics=args.numerics,
                          mmproj=getattr(args, "mmproj", None))
    except DraftMismatchError:   # with no target given, only a draft's own file is refused so
        raise DraftMismatchError(f"{path} is a DFlash draft, not a model: run the model it drafts "
                                 f"for with this file as its draft, muser-torch {command} MODEL.gguf "
                                 f"--draft {path}") from None
    if model.tokenizer is None:
        raise ValueError(f"{path} carries no tokenizer (no tokenizer.ggml.* keys, or "
                         f"tokenizer.ggml.model 'none'); {command} needs a tokenizer")
    return model


def load_draft(path: Path, model, args: argparse.Namespace):
    """The DFlash draft at ``path`` for ``model``, in the command's numerics."""
    from .models import from_gguf
    return from_gguf(path, target=model, numerics=args.numerics)


def main(args: argparse.Namespace) -> int:
    from . import ops

    # Every argument is checked before the model loads and the prompt is echoed.
    check_sampling_args(args)
    path = model_path(args.model, args.lane)
    if args.draft is not None:
        draft_path(args.draft)
    videos = check_visual_args(args)
    device = resolve_device(args.device)
    if args.backend == "metal-emulator" and device.type != "cpu":
        raise ValueError(f"--backend metal-emulator runs on CPU tensors; got --device {device.type}")
    try:
        check_numerics(args.numerics, device, args.backend)
    except ValueError as e:
        raise ValueError(f"--numerics {args.numerics} --backend {args.backend}: {e}") from None
    model = load_model(path, device, args)
    if args.draft is not None:
        model.draft = load_draft(args.draft, model, args)
    tok = model.tokenizer
    if device.type == "cpu" and args.backend == "native":
        # A first run compiles the CPU kernels here, before any text: the notice and
        # its seconds stand on their own lines on stderr, out of the prompt's time.
        ops.cpu.build_now()
    with ops.use_backend(args.backend):
        if args.chat:
            return _chat(model, tok, path, device, args, videos)
        prompt = "def " if args.prompt is None else args.prompt
        ids = tok.encode(prompt)
        embeds = None
        if args.image or videos:
            ids, embeds = _with_visuals(model, tok, ids, args.image or [], videos, device, args.engine)
        check_room(len(ids), args.max_new_tokens, model.config.context_length)
        sys.stdout.write(prompt)
        _generate(model, tok, ids, path, device, args, embeds)
    return 0


def check_visual_args(args: argparse.Namespace) -> list:
    """``--image`` and ``--video`` need ``--mmproj``; the videos (``vision.Video``),
    read from disk before the model loads (a bad one is an ``ImageError``)."""
    if getattr(args, "mmproj", None) is not None and not args.mmproj.is_file():
        raise ValueError(f"--mmproj {args.mmproj}: no such file")
    videos = getattr(args, "video", None) or []
    for flag, given in (("--image", args.image), ("--video", videos)):
        if given and args.mmproj is None:
            raise ValueError(f"{flag} needs --mmproj MMPROJ, the model's vision projector file")
    if not videos:
        return []
    if not (math.isfinite(args.video_fps) and args.video_fps > 0):
        raise ValueError(f"--video-fps must be a finite number > 0, got {args.video_fps}")
    from .errors import ImageError
    from .vision.video_files import video_from_path
    out = []
    for path in videos:
        try:
            out.append(video_from_path(path, args.video_fps))
        except ImageError as e:
            raise type(e)(f"--video {e}") from None
    return out


class _ChatVisuals:
    """A chat's images and videos: preprocessed and through the tower once. They
    open the first user turn as ``special.SLOT`` s, which the chat's encoding
    turns into the stand-in markup as markup (``encode_chat(slot=IMAGE_MARK)``:
    text the user types stays text); each turn's prompt then gets each stand-in
    replaced by its image's or video's block (``fill_marks``) and the rows."""

    def __init__(self, model, images: list[Path], videos: list, device: torch.device,
                 engine: str = "auto") -> None:
        from .text.special import SLOT
        from .vision.prompt import IMAGE_MARK, visual_block
        self.model, self.device = model, device
        self.inputs = model.prepare_visual(images, videos)
        self.rows = model.visual_rows(self.inputs, engine)
        merge = model.vision.config.merge
        self.blocks = [visual_block(model.tokenizer, x, merge) for x in self.inputs]
        self.slots, self.markup = SLOT * len(self.inputs), IMAGE_MARK

    def open_turn(self, user: str) -> str:
        from .text.special import SLOT
        if SLOT in user:
            raise ValueError(f"the message holds U+{ord(SLOT):04X}, a Unicode noncharacter reserved "
                             f"for an image's place")
        return self.slots + user

    def fill(self, ids: list[int]):
        from .vision.prompt import fill_marks, placeholder_rows
        ids = fill_marks(self.model.tokenizer, ids, self.blocks)
        img_id, vid_id = self.model.placeholder_ids()
        t = torch.tensor([ids], device=self.device)
        return ids, placeholder_rows(t, self.inputs, self.rows, self.model.vision.config.merge, img_id, vid_id)


def _with_visuals(model, tok, ids: list[int], images: list[Path], videos: list, device: torch.device,
                  engine: str = "auto"):
    """The prompt with each image's block (``<|image_start|>``, its placeholders,
    ``<|image_end|>``), then each video's (``<|vid_start|>`` ... ``<|vid_end|>``),
    before the text, after a leading BOS; and the rows for them."""
    inputs = model.prepare_visual(images, videos)
    head = ids[:1] if ids and tok.bos_id is not None and ids[0] == tok.bos_id else []
    n_images = len(images)
    ids = head + model.image_prompt(inputs[:n_images]) + model.video_prompt(inputs[n_images:]) + ids[len(head):]
    t = torch.tensor([ids], device=device)
    img_id, vid_id = model.placeholder_ids()
    from .vision.prompt import placeholder_rows
    return ids, placeholder_rows(t, inputs, model.visual_rows(inputs, engine), model.vision.config.merge,
                                 img_id, vid_id)


def _chat(model, tok, path: Path, device: torch.device, args: argparse.Namespace, videos: list) -> int:
    """One turn (``--prompt``) or a conversation read line by line from stdin."""
    if getattr(tok, "chat_template", None) is None:
        from .errors import ChatTemplateError
        raise ChatTemplateError(f"{path.name}: --chat needs tokenizer.chat_template; the file has none")
    messages: list[dict] = []
    limits = chat_limits(args)
    visual = _ChatVisuals(model, args.image or [], videos, device, args.engine) if args.image or videos else None
    turns = [args.prompt] if args.prompt is not None else None
    while True:
        if turns is not None:
            if not turns:
                return 0
            user = turns.pop(0)
        else:
            sys.stderr.write("> ")
            sys.stderr.flush()
            user = sys.stdin.readline()
            if not user:
                return 0
            user = user.rstrip("\n")
        if visual is not None and not messages:     # the images and videos open the first user turn
            user = visual.open_turn(user)
        messages.append({"role": "user", "content": user})
        # renders within limits (ChatTemplateError)
        ids = tok.encode_chat(messages, limits=limits) if visual is None else \
            tok.encode_chat(messages, limits=limits, slot=visual.markup)
        embeds = None
        if visual is not None:
            ids, embeds = visual.fill(ids)
        check_room(len(ids), args.max_new_tokens, model.config.context_length)
        answer = _generate(model, tok, ids, path, device, args, embeds)
        messages.append({"role": "assistant", "content": answer})


def _generate(model, tok, ids: list[int], path: Path, device: torch.device,
              args: argparse.Namespace, embeds=None) -> str:
    """Stream the continuation of ``ids`` to stdout as its text settles
    (``TextStream``); return its text."""
    out = sys.stdout
    out.flush()
    stop = set(tok.stop_ids)
    if getattr(model, "draft", None) is not None:
        return _generate_drafted(model, tok, ids, path, device, args, stop, embeds)
    text = TextStream(tok)
    synchronize(device)
    start = time.perf_counter()
    first = None
    for token in model.stream(torch.tensor(ids, device=device), args.max_new_tokens,
                              temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                              seed=args.seed, stop=sorted(stop), engine=args.engine,
                              embeds=embeds):
        t = int(token[0])
        if first is None:
            first = time.perf_counter()  # prefill done (and its token sampled)
        if t in stop:
            break
        piece = text.push(t)
        if piece:
            out.write(piece)
            out.flush()
    out.write(text.finish() + "\n")
    end = time.perf_counter()
    new = text.ids
    n = len(new) + (1 if first is not None and len(new) < args.max_new_tokens else 0)
    decode_s = end - (first or end)
    per_token = model.weight_bytes_per_token()
    # a rate needs two tokens (the first one's time is the prompt's); with fewer, none is shown
    decode = ""
    if n > 1 and decode_s > 0:
        rate = (n - 1) / decode_s
        decode = f", decode {rate:.1f} tok/s ({per_token * rate / 1e9:.2f} GB/s)"
    prompt_s = f"in {first - start:.3f} s" if first is not None else "(not run: no token asked)"
    print(f"[{path.name} on {device}: prompt {len(ids)} tokens {prompt_s}; {n} new tokens{decode}; "
          f"{per_token / 1e6:.2f} MB of weights read per token]", file=sys.stderr)
    return text.shown


def _generate_drafted(model, tok, ids: list[int], path: Path, device: torch.device,
                      args: argparse.Namespace, stop: set[int], embeds=None) -> str:
    """The continuation of ``ids`` with the draft, printed when done; return its text."""
    synchronize(device)
    start = time.perf_counter()
    out, stats = model.generate(torch.tensor(ids, device=device), args.max_new_tokens,
                                draft=model.draft, return_stats=True, temperature=args.temperature,
                                top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=sorted(stop),
                                engine=args.engine, embeds=embeds)
    synchronize(device)
    seconds = time.perf_counter() - start
    new = [t for t in out[len(ids):].tolist() if t not in stop]
    text = tok.decode(new)
    sys.stdout.write(text + "\n")
    n = len(out) - len(ids)
    print(f"[{path.name} with {args.draft.name} on {device}: prompt {len(ids)} tokens, {n} new tokens "
          f"in {seconds:.3f} s ({n / seconds:.1f} tok/s, prefill included); {stats.rounds} rounds, "
          f"mean accepted {stats.mean_accepted:.2f} draft tokens per round]", file=sys.stderr)
    return text
