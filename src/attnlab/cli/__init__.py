"""The attnlab command line. A thin layer: each command calls library functions and prints what they return.

Each module in COMMAND_MODULES has ``register(subparsers)``, which adds its commands.
"""

from __future__ import annotations

import gc
import importlib
import sys

from .. import __version__
from ._app import ArgumentParser, UsageError, run

COMMAND_MODULES = ("tour", "guide", "attend", "context", "weights", "train", "generate", "chat", "bench", "tune",
                   "longctx", "interpret", "sinks")


# each command's module, so that a command line naming one imports that module alone (a SmolLM2 command's first
# token waits on no other module; tests/test_program_exit.py holds the table to what each module registers)
COMMANDS = {"tour": "tour", "attend": "attend", "context": "context", "explain-weights": "weights", "train": "train",
            "generate": "generate", "chat": "chat", "bench": "bench", "tune": "tune", "longctx": "longctx",
            "sinks": "sinks",
            **dict.fromkeys(("floors", "lookup", "explain", "scale", "mask", "embed", "heads", "order", "cost",
                             "tokens"), "guide"),
            **dict.fromkeys(("detect", "ablate", "patch", "attribute", "lens", "ioi", "scan", "interpret"),
                            "interpret")}


def build_parser(command: str | None = None) -> ArgumentParser:
    """The command line's parser: every command, or with ``command`` (a key of :data:`COMMANDS`) the commands of
    its module only (the same parser for that command line, without importing the others)."""
    parser = ArgumentParser(prog="attnlab", description="The attention mechanism of transformers, in numpy, "
                            "following the guide 'Attention: letting tokens look at each other'.",
                            epilog="Start with 'attnlab tour'; 'attnlab COMMAND --help' says what a command shows, "
                                   "which section of the guide it belongs to, and gives examples.")
    parser.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    for name in COMMAND_MODULES if command is None else (COMMANDS[command],):
        importlib.import_module(f".{name}", __name__).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)   # one module, or all
        args = parser.parse_args(argv)
    except UsageError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\nattnlab: interrupted", file=sys.stderr)
        return 130
    if not hasattr(args, "func"):
        parser.print_help()
        return 0
    return run(args.func, args)


def program() -> int:
    """:func:`main` as the program runs it (``python -m attnlab``, the ``attnlab`` script): its exit code, the
    objects it made frozen first (``gc.freeze``), so the interpreter's last collections at exit skip them and the
    operating system takes the memory back. numba's compiler, once a kernel is loaded, leaves a graph of objects
    whose collection at exit cost 0.3 s of a 1.9 s ``generate --quantized`` (process time, Xeon, loaded); nothing
    is written or computed then. Not for calls in a process that goes on (tests): they would keep that memory."""
    code = main()
    gc.freeze()
    return code
