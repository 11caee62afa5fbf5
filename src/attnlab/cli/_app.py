"""What every command shares: one-line errors with exit code 2, and ``--json`` output."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import re
import sys
import textwrap

import numpy as np

from ._progress import stderr_progress  # noqa: F401  (the commands' bars: one helper, cli/_progress.py)


class UsageError(Exception):
    """A bad command line: printed as one line, exit code 2."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with one-line errors and no abbreviated options: ``heads --h 4`` is an error, not ``--help``.

    Subcommand parsers are made by this same class (argparse's ``parser_class``), so the rule holds everywhere.
    """

    def __init__(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message):          # argparse would print the usage block and exit; we want one line
        command = self.prog.removeprefix("attnlab").strip()
        raise UsageError(f"{command}: {message}" if command else message)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, but an unknown option is an error here, in the command that was given it, with the
        closest option that command has: ``--mesage`` → ``--message``, ``--max-tokens`` → ``--tokens``. (The
        subcommand's own parser runs this first, so it is the one that knows the command's options.)"""
        if self._subparsers is None and args is not None:     # a command's own parser: before "required" errors
            self.refuse_unknown([a for a in args[:args.index("--") if "--" in args else len(args)]
                                 if a.startswith("--") and a.split("=", 1)[0] not in self._option_string_actions])
        namespace, extras = super().parse_known_args(args, namespace)
        self.refuse_unknown([a for a in extras if a.startswith("--") and len(a) > 2], extras)
        return namespace, extras

    def refuse_unknown(self, unknown: list, extras: list | None = None) -> None:
        if not unknown:
            return
        options = [o for o in self._option_string_actions if o.startswith("--")]
        near = closest_option(unknown[0], options)
        whole = " (options are never abbreviated)" if near and near.startswith(unknown[0].split("=", 1)[0]) else ""
        hint = f"; did you mean {near}?{whole}" if near else ""
        self.error(f"unrecognized arguments: {' '.join(extras or unknown)}{hint}")


def closest_option(typed: str, options) -> str | None:
    """The option ``typed`` most likely meant: the one it begins (``--temp`` → ``--temperature``), else the
    nearest in spelling (difflib, ratio at least 0.6), else None."""
    name = typed.split("=", 1)[0]
    longer = [o for o in options if o.startswith(name) and o != name]
    if len(longer) == 1:
        return longer[0]
    found = difflib.get_close_matches(name, sorted(options), n=1, cutoff=0.6)
    return found[0] if found else None


def run(func, args) -> int:
    """Call a command; bad input becomes one line on stderr and exit code 2, never a traceback."""
    try:
        code = func(args) or 0
        sys.stdout.flush()
        return code
    except BrokenPipeError:            # `attnlab ... | head`: the reader left; say nothing
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # Python's documented recipe
        return 0
    except (ValueError, TypeError, OSError, UsageError) as e:
        print(f"attnlab: error: {one_line(e)}", file=sys.stderr)
        return 2
    except MemoryError as e:           # numbers too big for this machine, e.g. `scale --pairs 10**12`
        print(f"attnlab: error: not enough memory for these numbers ({one_line(e)}); try smaller ones",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("attnlab: interrupted", file=sys.stderr)
        return 130


def one_line(e: BaseException) -> str:
    text = str(e) if not isinstance(e, OSError) or not e.filename else f"{e.strerror}: {e.filename}"
    return " ".join(text.split()) or type(e).__name__


def jsonable(x):
    """numpy arrays and scalars as plain lists and numbers (NaN/inf as strings)."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return jsonable(x.tolist())
    if isinstance(x, np.generic):
        return jsonable(x.item())
    if isinstance(x, float) and not np.isfinite(x):
        return str(x)
    return x


def print_json(data) -> None:
    print(json.dumps(jsonable(data), indent=2))


def seed_arg(text: str) -> int:
    """An argparse type for ``--seed``: an integer >= 0, which ``numpy.random.default_rng`` takes."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def number_type(convert, ok, expected: str):
    """An argparse type: ``convert(text)`` (int or float) when ``ok`` of it, else argparse's error
    "{expected}, got '…'" (argparse prefixes the option's name)."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            value = None
        if value is None or not ok(value):
            raise argparse.ArgumentTypeError(f"{expected}, got {text!r}")
        return value
    return parse


positive_int = number_type(int, lambda v: v >= 1, "expected an integer >= 1")              # --tokens, --top, …
non_negative_float = number_type(float, lambda v: 0 <= v < float("inf"),
                                 "must be a number >= 0 (finite; 0 = greedy)")              # --temperature
probability = number_type(float, lambda v: 0 < v <= 1, "must be a number in (0, 1]")      # --top-p


@contextlib.contextmanager
def as_typed(**names: str):
    """Name what the learner typed, not the library's parameter: inside, a ValueError or TypeError whose message
    names a parameter (``swapped must …``) is raised again with the flag instead (``the second --sentence
    must …``). Only the message's own words are renamed, never a quoted value after ", got"."""
    try:
        yield
    except (ValueError, TypeError) as e:
        text = str(e)
        head, sep, tail = text.partition(", got ")
        for name, typed in names.items():
            head = re.sub(rf"(?<![\w'-]){re.escape(name)}(?![\w'-])", typed, head)
        if head + sep + tail == text:
            raise
        raise type(e)(head + sep + tail) from None


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the results as JSON, for scripts")


# --- help that teaches: every command's --help opens with what it shows and where it sits in the guide ---

GUIDE_OPENING = "Attention: letting tokens look at each other"   # the guide's title, over its two gaps
GUIDE_SECTIONS = (          # the guide's opening and section titles, in its order (the tour follows them)
    GUIDE_OPENING,
    "Why context pays",
    "The idea: a soft lookup",
    "Where queries, keys and values come from",
    "Keeping the softmax usable: the square root of d_k",
    "No peeking: the causal mask",
    "Several heads at once",
    "Order: giving tokens a position",
    "The price of looking at everything",
    "What attention is, and isn't",
)


class TeachingFormatter(argparse.HelpFormatter):
    """argparse's help, with the description's paragraphs wrapped and the epilog's indented example lines kept
    as they are, so they can be pasted."""

    def _fill_text(self, text, width, indent):
        out = []
        for line in text.splitlines():
            out.append(indent + line if line.startswith(" ") or not line else
                       textwrap.fill(line, width, initial_indent=indent, subsequent_indent=indent))
        return "\n".join(out)


def add_command(sub, name: str, *, help: str, shows: str, examples, section: str | None = None,
                beyond: str | None = None, more: str = "", **kwargs) -> argparse.ArgumentParser:
    """A subcommand whose ``--help`` teaches: one sentence on what it shows and which section of the guide it
    belongs to (``section``, one of :data:`GUIDE_SECTIONS`) or, for a command beyond the guide, which page
    documents it (``beyond``, e.g. ``"docs/interpret.md"``); then ``more``; then examples that run as written.

    ``shows`` is the sentence's start without its full stop, e.g. "Shows the causal mask M"; ``examples`` are
    whole command lines ("attnlab mask 8"), each optionally followed by "  # what it shows".
    """
    if (section is None) == (beyond is None):
        raise ValueError(f"{name}: give either section (a guide section) or beyond (a docs page), not both")
    if section is not None and section not in GUIDE_SECTIONS:
        raise ValueError(f"{name}: section must be one of the guide's sections {GUIDE_SECTIONS}, got {section!r}")
    examples = tuple(examples)
    if not examples or not all(e.startswith("attnlab ") for e in examples):
        raise ValueError(f"{name}: examples must be one or more command lines starting 'attnlab ', got {examples}")
    where = (f"the guide's opening, “{section}”" if section == GUIDE_OPENING else
             f"the guide's section “{section}”" if section else f"beyond the guide: see {beyond}")
    description = f"{shows} ({where})." + (f"\n{more}" if more else "")
    epilog = "examples:\n" + "\n".join(f"  {e}" for e in examples)
    p = sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=TeachingFormatter,
                       **kwargs)
    p.set_defaults(help_examples=examples)
    return p


def help_examples(help_text: str) -> list[str]:
    """The example command lines of a ``--help`` text, each without its trailing ``# …`` comment."""
    _, _, tail = help_text.partition("\nexamples:\n")
    lines = [line.strip() for line in tail.splitlines() if line.startswith("  attnlab ")]
    return [re.sub(r"\s+#.*$", "", line) for line in lines]
