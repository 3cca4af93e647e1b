"""``muser-torch bench {formats,ops,model,compile,triton}``: throughput reported as ratios
measured in one run, never asserted by tests."""
from __future__ import annotations

import importlib

_BENCHES = ("formats", "ops", "model", "compile", "triton_kernels")


def register(subparsers) -> None:
    parser = subparsers.add_parser("bench",
                                   help="benchmarks (formats, ops, model, compile, triton)")
    sub = parser.add_subparsers(dest="bench", required=True)
    for name in _BENCHES:
        try:
            module = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise
            continue
        module.register(sub)
