"""``--json`` draws no progress bar, even when stderr is a terminal (issue 34 part 2: "It says nothing when
stderr is not a terminal, or with --json"): train, the induction run, floors, longctx, bench."""

import io
import json

import pytest

from attnlab.cli import main


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""
    def isatty(self):
        return True


def run_on_terminal(monkeypatch, capsys, argv):
    monkeypatch.setenv("COLUMNS", "160")
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    code = main(argv)
    return code, capsys.readouterr().out, terminal.getvalue()


@pytest.mark.parametrize("argv", [
    ["train", "--steps", "2", "--context", "8", "--d-model", "16"],
    ["train", "--task", "induction", "--steps", "2"],
])
def test_training_with_json_draws_no_bar(monkeypatch, capsys, argv):
    code, out, err = run_on_terminal(monkeypatch, capsys, argv + ["--json"])
    assert code == 0 and json.loads(out) and err == ""


def test_the_bar_still_draws_on_a_terminal_without_json(monkeypatch, capsys):
    code, out, err = run_on_terminal(monkeypatch, capsys, ["train", "--steps", "2", "--context", "8",
                                                          "--d-model", "16"])
    assert code == 0 and "training" in err


def test_floors_of_a_file_with_json_draws_no_bar(monkeypatch, capsys, tmp_path):
    text = tmp_path / "t.txt"
    text.write_text("the cat sat on the mat " * 20, encoding="utf-8")
    code, out, err = run_on_terminal(monkeypatch, capsys, ["floors", str(text), "--json"])
    assert code == 0 and json.loads(out)["rows"] and err == ""


def test_bench_progress_steps_stay_silent_with_json(monkeypatch):
    from attnlab.cli.bench import progress_bar
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    with progress_bar(2, quiet=True) as step:
        step("one")
        step("two")
    assert terminal.getvalue() == ""
    with progress_bar(2) as step:                       # a terminal without --json: drawn
        step("one")
    assert "one" in terminal.getvalue()


def test_longctx_with_json_draws_no_bar(monkeypatch, capsys):
    pytest.importorskip("distributed")
    code, out, err = run_on_terminal(monkeypatch, capsys, ["longctx", "--n", "256", "--workers", "1", "--json"])
    assert code in (0, 1) and json.loads(out) and err == ""
