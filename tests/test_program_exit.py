"""The program's exit (``python -m attnlab``, the ``attnlab`` script): what it built is frozen for the garbage
collector before the interpreter ends (attnlab.cli.program), so the last collections at exit skip numba's
object graph; a call of ``main`` in a process that goes on freezes nothing."""

import gc
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
REPORT = "import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"


def exit_report(code: str) -> str:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", REPORT + code], env=env, capture_output=True, text=True, timeout=120)
    return run.stdout.splitlines()[-1]


def test_python_dash_m_attnlab_freezes_before_it_exits():
    code = "import runpy, sys; sys.argv = ['attnlab', 'cost']; runpy.run_module('attnlab', run_name='__main__')"
    assert exit_report(code) == "frozen True"


def test_the_console_script_freezes_before_it_exits():
    code = "import sys; sys.argv = ['attnlab', 'cost']; import attnlab_launch; raise SystemExit(attnlab_launch.main())"
    assert exit_report(code) == "frozen True"


def test_main_in_a_process_that_goes_on_freezes_nothing(capsys):
    from attnlab.cli import main
    before = gc.get_freeze_count()
    assert main(["cost"]) == 0
    assert gc.get_freeze_count() == before
