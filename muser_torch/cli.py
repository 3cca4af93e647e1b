"""The ``muser-torch`` command. Each subcommand lives in its own module, which
exposes ``register(subparsers)``; this file only lists them."""
from __future__ import annotations

import argparse
import importlib
import sys

from .errors import MissingExtraError
from .text.requirements import missing_from

# module -> it adds one subcommand (bench adds its own sub-subcommands)
_COMMANDS = ("muser_torch.run", "muser_torch.inspect", "muser_torch.tiny", "muser_torch.bench",
             "muser_torch.convert", "muser_torch.serve")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="muser-torch",
        description="GGUF K-quant and NVFP4 weights, kept packed, as PyTorch ops.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMANDS:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:   # Ctrl-C: whatever the command wrote is cleaned up by now
        print(f"muser-torch {args.command}: interrupted", file=sys.stderr)
        return 130
    except ModuleNotFoundError as e:   # an optional package: the install command, in one line
        refusal = missing_from(e)
        if refusal is None:
            raise
        print(f"muser-torch {args.command}: error: {refusal}", file=sys.stderr)
        return 2
    except (ValueError, OSError, MissingExtraError) as e:
        # GGUFError and the other typed refusals: a clear one-line message, no traceback
        print(f"muser-torch {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
