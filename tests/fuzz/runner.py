"""Running mutants, each in its own process, and counting what happened.

The runner is a fork server: it imports torch and muser_torch once, warms
them up on an unmutated file (one thread, so no thread pool exists to be
broken by fork), then forks one child per attempt. The child

1. lowers its address-space limit (``RLIMIT_AS``) to what it has now plus
   twice the cap and twice the file (``load_gguf`` and the model loader each
   map it) and 256 MB: a backstop against one huge allocation;
2. runs ``load_gguf``, the model loader (which builds the file's tokenizer),
   the chat stage (the file's ``tokenizer.chat_template`` compiled and
   rendered, when it has one) and a 4-token greedy ``generate`` (of the chat
   prompt when there is one), reporting each stage to the parent over a pipe
   before entering it;
3. reports the outcome: ok, or the exception's class, message and the
   innermost frame of its traceback.

The parent enforces the per-attempt timeout (a hang), samples the child's
resident set every few milliseconds against the cap (RSS growth over the
fork point at most ``file size + cap_mb``), and reads the peak RSS from
``wait4``. A child that dies without a report crashed.

The timeout is CPU seconds of the child (its own, counted from the fork),
so a loaded machine, which slows an attempt's wall time but not its CPU
time, does not turn a slow attempt into a hang. A child blocked without
using the CPU is a hang at ``WALL_FACTOR`` times the timeout in wall time:
an honest attempt, which needs a tenth of its CPU timeout at most, would
need a CPU share under 1/100 to reach it.

Outcomes: ``ok``; ``typed`` (a ``GGUFError`` subclass, ``MetadataError`` and
``ChatTemplateError`` included, or a ``ContextLengthError``: a file whose
context length is shorter than the chat prompt is refused in the generate
stage naming both numbers; counted by class);
``untyped`` (any other exception, counted by class); ``crash``; ``hang``;
``over-cap`` (killed by the RSS watch, or a ``MemoryError`` or allocator
failure under the address-space limit).
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

STAGES = ("load", "model", "chat", "generate")
CHAT = [{"role": "user", "content": "Hi, what is 2 + 2?"}]
BAD = ("untyped", "crash", "hang", "over-cap")
WALL_FACTOR = 10    # wall seconds of a blocked child, in CPU timeouts
_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Result:
    index: int
    detail: str
    touches: tuple[str, ...]
    outcome: str                 # ok | typed | untyped | crash | hang | over-cap
    stage: str | None = None     # the stage it ended in (None when ok)
    error: str | None = None     # the exception's class (or the signal)
    message: str | None = None
    where: str | None = None     # innermost traceback frame, file:line
    peak_rss: int = 0            # bytes, the child's high-water mark
    rss_growth: int = 0          # bytes, peak over the fork point
    seconds: float = 0.0
    known: str | None = None     # name of the known loader failure it matches

    def to_json(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


# ---- the model-loader entry point ---------------------------------------------------

def model_loader():
    """``muser_torch.from_gguf`` if the package has one, else ``Glimmer.from_gguf``."""
    import muser_torch
    return getattr(muser_torch, "from_gguf", None) or muser_torch.Glimmer.from_gguf


def warm_up(path: Path) -> None:
    """One clean run in the server, so children inherit torch's lazily imported
    modules and the native kernels instead of paying for them per attempt."""
    import torch

    from muser_torch import load_gguf
    from muser_torch.ops import cpu
    torch.set_num_threads(1)
    cpu.native_available()
    load_gguf(path)
    try:   # the chat stage's modules, so a child does not import them
        from muser_torch.text.chat import ChatTemplate
        ChatTemplate("{% for m in messages %}{{ m['content'] ~ '!' }}{% endfor %}", {}).render(CHAT)
    except ImportError:
        pass
    try:
        model = model_loader()(path, dtype=torch.float32)
        _generate(model)
    except Exception:   # noqa: BLE001  (a base file that no model loads still warms the reader)
        pass


def _chat(model) -> list[int] | None:
    """The chat prompt's ids when the file has a chat template, else None."""
    tok = model.tokenizer
    if tok is None or getattr(tok, "chat_template", None) is None:
        return None
    return tok.encode_chat(CHAT)


def _generate(model, ids: list[int] | None = None):
    import torch
    tok = model.tokenizer
    if ids is None:
        ids = tok.encode("def ", bos=True) if tok is not None else [0]
    return model.generate(torch.tensor(ids), 4)


# ---- the child ------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE


def _vm() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[0]) * _PAGE


def _hwm() -> int:
    """This process's peak resident set (VmHWM) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _is_alloc_failure(e: BaseException) -> bool:
    return isinstance(e, MemoryError) or (
        isinstance(e, RuntimeError) and "alloc" in str(e).lower() and "memory" in str(e).lower())


def run_stages(path: str, say: Callable[[dict], None]) -> None:
    """The attempt: ``load_gguf``, the model loader, a 4-token greedy generate;
    ``say`` reports each stage before it starts."""
    import torch

    from muser_torch import load_gguf
    say({"stage": "load"})
    f = load_gguf(path)
    del f
    say({"stage": "model"})
    model = model_loader()(path, dtype=torch.float32)
    say({"stage": "chat"})
    ids = _chat(model)
    say({"stage": "generate"})
    _generate(model, ids)


def _child(path: str, file_size: int, cap: int, wfd: int, target: Callable) -> None:
    def say(obj) -> None:
        os.write(wfd, (json.dumps(obj) + "\n").encode())

    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    # The address-space limit is the backstop for one huge allocation; gradual
    # growth meets the parent's RSS watch first (cap + file size of growth).
    limit = _vm() + 2 * file_size + 2 * cap + (256 << 20)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))   # a crash is counted, not dumped
    try:   # restart the high-water mark at what the fork inherited (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
    say({"rss0": _rss()})
    stage: list[str | None] = [None]

    def say_stage(obj) -> None:
        stage[0] = obj.get("stage", stage[0])
        say(obj)

    try:
        from muser_torch import ContextLengthError, GGUFError
        target(path, say_stage)
        say({"hwm": _hwm(), "outcome": "ok"})
    except BaseException as e:  # noqa: BLE001  (classifying everything is the point)
        tb = traceback.extract_tb(e.__traceback__)
        where = f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else None
        if _is_alloc_failure(e):
            outcome = "over-cap"
        elif isinstance(e, (GGUFError, ContextLengthError)):
            outcome = "typed"
        else:
            outcome = "untyped"
        say({"hwm": _hwm(), "outcome": outcome, "stage": stage[0], "error": type(e).__name__,
             "message": str(e)[:400], "where": where})
    os._exit(0)


# ---- the parent -----------------------------------------------------------------------

@dataclass
class _Running:
    pid: int
    rfd: int
    result: Result
    started: float
    base_rss: int    # the server's RSS at the fork, until the child reports its own
    cap: int         # allowed RSS growth in bytes
    slot: Path
    timeout_s: float
    buf: bytes = b""
    sampled_peak: int = 0
    report: dict = field(default_factory=dict)
    killed: str | None = None


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system, every thread) the process has used."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _TICK    # utime, stime
    except (OSError, IndexError, ValueError):
        return 0.0


def _proc_rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class Pool:
    """Up to ``workers`` children at a time, each with its own mutant file
    (a slot under ``tmp``); ``submit`` blocks while every slot is busy.
    ``timeout_s`` is CPU seconds per attempt; a blocked attempt is a hang at
    ``wall_factor`` times that in wall time (see the module's docstring)."""

    def __init__(self, workers: int, timeout_s: float, cap_mb: int, tmp: Path,
                 target: Callable[[str, Callable], None] = run_stages,
                 wall_factor: float = WALL_FACTOR) -> None:
        self.workers = workers
        self.target = target
        self.timeout_s = timeout_s
        self.wall_factor = wall_factor
        self.cap = cap_mb << 20
        self.free = [tmp / f"slot{i}.gguf" for i in range(workers)]
        self.running: dict[int, _Running] = {}
        self.done: list[Result] = []

    def submit(self, write: Callable[[Path], object], file_size: int, result: Result,
               timeout_s: float | None = None) -> None:
        """Write the mutant with ``write(slot_path)``, then run it in a child on
        the path ``write`` returns if it returns one (a split model's first
        part, beside the slot), else on the slot. ``timeout_s`` overrides the
        pool's timeout for this one."""
        while not self.free:
            self._poll()
        slot = self.free.pop()
        written = write(slot)
        run_path = written if isinstance(written, Path) else slot
        rfd, wfd = os.pipe()
        base = _rss()
        pid = os.fork()
        if pid == 0:
            os.close(rfd)
            try:
                _child(str(run_path), file_size, self.cap, wfd, self.target)
            finally:
                os._exit(70)
        os.close(wfd)
        self.running[rfd] = _Running(pid, rfd, result, time.monotonic(), base,
                                     file_size + self.cap, slot, timeout_s or self.timeout_s)

    def drain(self) -> list[Result]:
        while self.running:
            self._poll()
        out, self.done = self.done, []
        return out

    def _poll(self) -> None:
        ready, _, _ = select.select(list(self.running), [], [], 0.005)
        for rfd in ready:
            run = self.running[rfd]
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                self._reap(run)
                continue
            run.buf += chunk
            *lines, run.buf = run.buf.split(b"\n")
            for line in lines:
                run.report.update(json.loads(line))
        now = time.monotonic()
        for run in list(self.running.values()):
            if run.killed:
                continue
            rss = _proc_rss(run.pid)
            run.sampled_peak = max(run.sampled_peak, rss)
            base = run.report.get("rss0", run.base_rss)
            if (_proc_cpu(run.pid) > run.timeout_s
                    or now - run.started > self.wall_factor * run.timeout_s):
                run.killed = "hang"
            elif rss > base + run.cap:
                run.killed = "over-cap"
            if run.killed:
                os.kill(run.pid, signal.SIGKILL)

    def _reap(self, run: _Running) -> None:
        del self.running[run.rfd]
        os.close(run.rfd)
        self.free.append(run.slot)
        _, status, _ = os.wait4(run.pid, 0)
        r, rep = run.result, run.report
        r.seconds = time.monotonic() - run.started
        # The child's own high-water mark since the fork point when it got to report
        # it, else the largest sample (ru_maxrss would include the server's pages).
        r.peak_rss = max(rep.get("hwm", 0), run.sampled_peak)
        r.rss_growth = max(0, r.peak_rss - rep.get("rss0", run.base_rss))
        r.stage = rep.get("stage")
        if run.killed:
            r.outcome = run.killed
        elif "outcome" in rep:
            r.outcome = rep["outcome"]
            r.error, r.message, r.where = rep.get("error"), rep.get("message"), rep.get("where")
            if r.outcome == "ok":
                r.stage = None
        else:
            r.outcome = "crash"
            r.error = (f"signal {signal.Signals(-os.waitstatus_to_exitcode(status)).name}"
                       if os.WIFSIGNALED(status) else f"exit {os.waitstatus_to_exitcode(status)}")
        if r.outcome == "over-cap" and run.killed:
            r.error = f"RSS grew over {run.cap >> 20} MB"
        self.done.append(r)
