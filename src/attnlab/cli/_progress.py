"""Progress on stderr for long work, one helper for every command.

The library never prints: its long loops take an optional ``progress(done, total)`` callback
(``load_model``'s tensors, ``patch``'s passes, …). :func:`progress` hands a command such a callback, drawn as
rich's bar on stderr with what is being done, how far it is and the time left, and only when stderr is a
terminal: a pipe, a log file or ``--json`` get nothing at all, so scripts see the same bytes as before.
Commands that draw their own columns (train, scan, bench) take :func:`stderr_progress`, under the same rule.
"""

from __future__ import annotations

import contextlib
import sys


def shows(quiet: bool = False) -> bool:
    """Whether a bar would be drawn: stderr is a terminal and the command was not asked for ``--json``."""
    if quiet:
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def stderr_progress(*columns, quiet: bool = False, **options):
    """A transient rich ``Progress`` on stderr with these columns, drawn only when :func:`shows`: a pipe or a
    log file gets nothing, not even the blank line rich leaves behind, so an error stays one line."""
    from rich.console import Console
    from rich.progress import Progress

    shown = shows(quiet)
    console = Console(file=sys.stderr, force_terminal=True) if shown else Console(stderr=True)
    return Progress(*columns, console=console, transient=True, disable=not shown, **options)


@contextlib.contextmanager
def progress(what: str, *, quiet: bool = False, total: int | None = None):
    """A callback ``step(done, total)`` for a library loop, shown as a transient bar on stderr.

    ``what`` is the bar's label ("loading smollm2 (135M parameters, Q4_1 → float32)…"); ``total`` the steps
    expected, if known before the first call (each call may give it too). ``quiet`` (a command's ``--json``)
    or a stderr that is not a terminal: the callback does nothing.
    """
    if not shows(quiet):
        yield lambda done, total=None: None
        return
    from rich.progress import (BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("left"), TimeRemainingColumn())
    with stderr_progress(*columns) as bar:
        task = bar.add_task(what, total=total)

        def step(done: int, total: int | None = None) -> None:
            bar.update(task, completed=done, **({} if total is None else {"total": total}))
        yield step
