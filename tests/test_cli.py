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
