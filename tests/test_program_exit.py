"""The program's start and exit (``python -m attnlab``, the ``attnlab`` script): a command line naming a
command imports that command's module alone (attnlab.cli.COMMANDS), and what the program built is frozen for
the garbage collector before the interpreter ends (attnlab.cli.program), so the last collections at exit skip
numba's object graph; a call of ``main`` in a process that goes on freezes nothing."""

import gc
import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
REPORT = "import atexit, gc; atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"


def last_line(code: str) -> str:
    """The last line a fresh Python printed running ``code`` with this attnlab."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return run.stdout.splitlines()[-1]


def exit_report(code: str) -> str:
    """Whether anything was frozen when the interpreter ran its exit hooks, after ``code``."""
    return last_line(REPORT + code)


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


def test_the_table_of_commands_is_what_each_module_registers():
    import importlib

    from attnlab.cli import COMMAND_MODULES, COMMANDS
    from attnlab.cli._app import ArgumentParser
    registered = {}
    for name in COMMAND_MODULES:
        sub = ArgumentParser(prog="attnlab").add_subparsers()
        importlib.import_module(f"attnlab.cli.{name}").register(sub)
        registered |= dict.fromkeys(sub.choices, name)
    assert registered == COMMANDS


def test_a_command_line_imports_its_command_s_module_alone():
    from attnlab.cli import COMMAND_MODULES
    imported = "print(sorted(m[12:] for m in sys.modules if m[12:] in COMMAND_MODULES))"
    code = "import sys; from attnlab.cli import main, COMMAND_MODULES; main([{}]); " + imported
    assert last_line(code.format("'cost', '--json'")) == "['guide']"
    assert last_line(code.format("'cots'")) == str(sorted(COMMAND_MODULES))   # a typo: every command, to suggest one


def test_the_same_parser_for_a_command_line(capsys):
    from attnlab.cli import build_parser
    argv = ["generate", "--model", "smollm2", "--prompt", "Hi", "--tokens", "3", "--top-k", "5", "--quantized=q8"]
    whole, alone = build_parser().parse_args(argv), build_parser("generate").parse_args(argv)
    assert vars(whole) == vars(alone)
