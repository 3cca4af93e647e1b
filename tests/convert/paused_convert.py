"""``muser-torch convert`` with a pause at one point of its run, for the
interrupted-write tests: ``python -m tests.convert.paused_convert MARKER POINT
ARGS...`` runs ``cli.main(ARGS)``, and when it reaches POINT it creates the
file MARKER and waits for a signal. POINT is ``start`` (before the file is
opened: the checkpoint is read and the plan made), ``tensor:K`` (the K-th
tensor's bytes are asked for: K tensors written) or ``rename`` (the
``.partial`` is complete, not yet renamed). The parent waits for MARKER, so
where the signal lands never depends on timing."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

from muser_torch import cli
from muser_torch.convert import pipeline
from muser_torch.gguf_io import writer


def main() -> int:
    marker, point, argv = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]

    def pause() -> None:
        marker.touch()
        while True:          # until a signal ends the process (or raises KeyboardInterrupt)
            signal.pause()

    if point == "start":
        save = pipeline.save_gguf
        pipeline.save_gguf = lambda *a, **kw: (pause(), save(*a, **kw))[1]
    elif point.startswith("tensor:"):
        k, produced, calls = int(point.split(":")[1]), writer._produced, [0]

        def counting(*a, **kw):
            if calls[0] == k:
                pause()
            calls[0] += 1
            return produced(*a, **kw)
        writer._produced = counting
    elif point == "rename":
        replace = writer.os.replace
        writer.os.replace = lambda *a: (pause(), replace(*a))[1]
    else:
        raise SystemExit(f"unknown point {point!r}")
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
