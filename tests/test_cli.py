import json
import subprocess
import sys

import pytest

from attnlab import __version__
from attnlab.cli import main


def test_help_and_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "attnlab" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--version"])
    assert __version__ in capsys.readouterr().out


def test_unknown_command_is_one_line_exit_2(capsys):
    assert main(["no-such-command"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("attnlab: error:") and err.count("\n") == 1


def test_module_entry_point_runs():
    r = subprocess.run([sys.executable, "-m", "attnlab", "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "commands" in r.stdout


def test_written_files_get_the_usual_mode(tmp_path):
    import os

    from attnlab._io import atomic_path
    with atomic_path(tmp_path / "f.txt") as tmp:
        tmp.write_text("x")
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "f.txt").stat().st_mode & 0o777 == 0o666 & ~mask
    assert [p.name for p in tmp_path.iterdir()] == ["f.txt"]


def test_failed_write_leaves_no_file(tmp_path):
    from attnlab._io import atomic_path
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "f.txt") as tmp:
            tmp.write_text("half")
            raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_broken_pipe_is_quiet():
    prog = "from attnlab.cli._app import run; import sys; sys.exit(run(lambda a: print('x' * 10**6), None))"
    r = subprocess.run(f'{sys.executable} -c "{prog}" | head -c 10 >/dev/null', shell=True,
                       capture_output=True, text=True)
    assert "Traceback" not in r.stderr and "error" not in r.stderr
