"""Writing files so that a failure leaves no half file behind."""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; on success it replaces ``path``, on failure it is removed.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_path(d / "a.txt") as tmp:
    ...     _ = tmp.write_text("hello")
    >>> (d / "a.txt").read_text()
    'hello'
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "No such directory", str(path.parent))
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "Is a directory, not a file", str(path))
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    except OSError as e:                     # e.g. a read-only folder: name the file asked for, not the temp
        raise type(e)(e.errno, f"Cannot write here ({e.strerror})", str(path)) from None
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())       # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
