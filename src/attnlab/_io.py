"""Files, safely: writing so that a failure leaves no half file behind, and reading a model folder's files
only from inside that folder."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import stat
import sys
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


@contextlib.contextmanager
def atomic_folder(path: str | os.PathLike, *, owned: tuple[str, ...]):
    """Yield a new empty folder beside ``path`` to write a set of files into; on success it takes ``path``'s
    place in one step, so that a reader finds the old set whole or the new set whole, never a mix; on failure
    (Ctrl-C included) it is removed and ``path`` is left as it was.

    The one step is a rename when ``path`` is missing or empty, else on Linux an atomic exchange of the two
    folders (``renameat2(RENAME_EXCHANGE)``), after which the old set is removed. Elsewhere ``path`` is first
    renamed aside: a kill between the two renames leaves no ``path`` but the old set whole beside it, as
    ``.NAME.*.old``. ``path`` may hold only the files named in ``owned`` (the set's own, from an earlier save):
    anything else in it would be swapped away, so it is refused. Not fsynced: safe against kills, not power loss.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp()) / "ck"
    >>> for text in ("one", "two"):
    ...     with atomic_folder(d, owned=("a.txt", "b.txt")) as tmp:
    ...         _ = (tmp / "a.txt").write_text(text), (tmp / "b.txt").write_text(text)
    >>> (d / "a.txt").read_text(), sorted(p.name for p in d.parent.iterdir())
    ('two', ['ck'])
    """
    path = check_folder_target(path, owned=owned)
    tmp = new_part(path)
    try:
        yield tmp
        os.chmod(tmp, 0o777 & ~_umask())                  # mkdtemp makes 0700; give the folder the usual mode
        if path.is_dir() and os.listdir(path):
            _exchange(tmp, path)                          # the one step: path now holds the new set
        else:
            os.replace(tmp, path)                         # an empty or missing folder: a plain rename
    finally:
        shutil.rmtree(tmp, ignore_errors=True)            # the old set after an exchange; the new one on failure


def check_folder_target(path: str | os.PathLike, *, owned: tuple[str, ...]) -> Path:
    """``path`` (symlinks resolved) once sure that :func:`atomic_folder` can put a set of files there: its
    parent is a folder this process can write in, and ``path`` is missing or a folder holding only ``owned``
    files. Call it before long work, so that a bad place fails first. Folders left by saves that were killed
    (``.NAME.*.part`` beside it, of a process no longer running) are removed."""
    path = Path(os.path.realpath(path))                   # a symlinked --out: the folder it points at moves
    if not path.parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "No such directory", str(path.parent))
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(path))
    other = sorted(set(os.listdir(path)) - set(owned)) if path.is_dir() else []
    if other:
        raise ValueError(f"{path} holds files that are not the checkpoint's ({', '.join(other[:3])}); give the "
                         f"checkpoint a folder of its own (it is replaced as a whole on every save)")
    remove_stale_parts(path)
    os.rmdir(new_part(path))                              # a read-only parent fails here, before any work
    return path


def new_part(path: Path) -> Path:
    """A new empty folder ``.NAME.<pid>-XXXXXXXX.part`` beside ``path``, to write a set of files into."""
    try:
        return Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}-", suffix=".part"))
    except OSError as e:                     # e.g. a read-only folder: name the folder asked for, not the temp
        raise type(e)(e.errno, f"Cannot write here ({e.strerror})", str(path)) from None


def remove_stale_parts(path: Path) -> list[Path]:
    """Remove the ``.NAME.*.part`` folders beside ``path`` that saves killed midway left: those of a process
    that no longer runs (or, named before they carried a pid, any); returns what was removed."""
    pattern = re.compile(rf"\.{re.escape(path.name)}\.(?:(\d+)-)?[a-z0-9_]{{8}}\.part")
    removed = []
    for entry in os.scandir(path.parent):
        m = pattern.fullmatch(entry.name)
        if m and entry.is_dir(follow_symlinks=False) and not (m.group(1) and running(int(m.group(1)))):
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def running(pid: int) -> bool:
    """Whether a process ``pid`` runs (this one included)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:                  # another user's process
        return True
    return True


def _exchange(new: Path, path: Path) -> None:
    """Swap two folders in one step (Linux renameat2); elsewhere, rename ``path`` aside, then ``new`` in."""
    if _renameat2_exchange(new, path):
        return
    aside = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
    os.replace(path, aside)
    os.replace(new, path)
    os.replace(aside, new)                                # so that the caller removes the old set


def _renameat2_exchange(a: Path, b: Path) -> bool:
    """Exchange two paths atomically with Linux's renameat2(RENAME_EXCHANGE); False where it is missing."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rename_exchange, at_fdcwd = 2, -100
    return hasattr(libc, "renameat2") and libc.renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b),
                                                         rename_exchange) == 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def folder_file(folder: str | os.PathLike, name, *, listed_in: str | None = None) -> Path:
    """``folder / name``, once it is sure to resolve (symlinks followed) to a path inside ``folder``; or inside
    the hub cache's ``blobs/`` when ``folder`` is a Hugging Face snapshot (``<entry>/snapshots/<rev>/``, whose
    files are symlinks into ``../../blobs``). Nothing is opened: a caller checks every entry before reading any.

    The snapshot's exception is narrow: ``blobs`` must be a real folder (not a symlink) beside ``snapshots``
    in the same cache entry, the file must resolve inside it, and every symlink followed on the way must sit
    inside the folder or inside ``blobs``; nothing is followed out of them (:func:`resolve_within`).

    ``name`` is untrusted (an index's ``weight_map`` value, a fixed name that may be a symlink); ``listed_in``
    names the file it came from, for the message. A missing file is returned as is: the caller says it is
    missing. The message names the entry, never what it points at.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> folder_file(d, "model.safetensors") == d / "model.safetensors"
    True
    >>> try:
    ...     folder_file(d, "../../etc/passwd")
    ... except ValueError as e:
    ...     print(str(e).split(": ", 1)[1][:58])
    the entry '../../etc/passwd' resolves outside the model fo
    """
    where = f" listed in {listed_in}" if listed_in else ""
    if not isinstance(name, str) or name.strip() in ("", ".") or "\0" in name:
        raise ValueError(f"{folder}: the entry {name!r}{where} must name a file of the model folder")
    root = os.path.realpath(folder)
    allowed = [root]
    blobs = hub_blobs(root)
    if blobs is not None:
        allowed.append(blobs)
    target = resolve_within(os.path.join(root, name), allowed)
    if target is None or not any(inside(target, a) for a in allowed):
        raise ValueError(f"{folder}: the entry {name!r}{where} resolves outside the model folder; attnlab reads "
                         "only files inside it (or, in a hub snapshot, the cache entry's own blobs/ folder)")
    return Path(folder) / name


def hub_blobs(root: str) -> str | None:
    """The ``blobs`` folder of the hub cache entry whose snapshot ``root`` is (``<entry>/snapshots/<rev>``,
    symlinks resolved); None when ``root`` is no snapshot, or when ``<entry>/blobs`` is not a real folder (a
    symlink to ``/`` would let a snapshot's links reach any file)."""
    snapshots = os.path.dirname(root)
    if os.path.basename(snapshots) != "snapshots":
        return None
    blobs = os.path.join(os.path.dirname(snapshots), "blobs")
    try:
        st = os.lstat(blobs)
    except OSError:
        return None
    return blobs if stat.S_ISDIR(st.st_mode) else None          # lstat: a symlink to a folder is not S_ISDIR


def inside(path: str, folder: str) -> bool:
    """Whether the absolute, normalised ``path`` lies strictly inside ``folder``."""
    return path != folder and os.path.commonpath([path, folder]) == folder


def resolve_within(path: str, allowed: list[str], *, most_links: int = 40) -> str | None:
    """``path`` with its symlinks resolved one by one, as ``os.path.realpath`` does, but refusing (None) to
    follow a symlink that does not itself sit inside one of the ``allowed`` folders, or more than
    ``most_links`` of them (a loop). ``..`` steps are taken by name, as the kernel takes them once the
    component before is known to be no symlink. Only ``lstat`` and ``readlink`` are called: nothing is opened."""
    parts = path.split(os.sep)[1:]                       # path is absolute: parts after the leading "/"
    done, links = "/", 0
    while parts:
        part = parts.pop(0)
        if part in ("", "."):
            continue
        if part == "..":
            done = os.path.dirname(done)
            continue
        step = os.path.join(done, part)
        if not os.path.islink(step):
            done = step
            continue
        links += 1
        if links > most_links or not any(inside(step, a) for a in allowed):
            return None
        link = os.readlink(step)
        parts = [p for p in link.split(os.sep) if p] + parts
        done = "/" if link.startswith(os.sep) else done
    return done
