"""Help that teaches: every command's --help opens with one sentence on what it shows and which section of
the guide (or which docs page) it belongs to, and ends with examples that run as written.

The commands are read from the parser itself, so a command added later is checked too.
"""

import argparse
import shlex
from pathlib import Path

import pytest

from attnlab.cli import build_parser, main
from attnlab.cli._app import GUIDE_SECTIONS, add_command, help_examples

ROOT = Path(__file__).resolve().parents[1]
GUIDE = Path("/work/shared/guide/attention-guide.txt")       # the guide itself, where this machine has it
# Examples that take more than a few seconds (a whole tour, a cluster, a bench, training): parsed, not run.
SLOW = {"tour", "bench", "tune", "longctx", "scan", "train", "ioi", "sinks"}
MY_TEXT = "The cat sat on the mat.\nThe dog saw the cat.\nA bank by the river.\n"   # MY_TEXT.txt in examples


def commands(parser=None, prefix=("attnlab",)):
    """(name words, parser) of every registered command, those inside a command group too."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*prefix, name), sub
                yield from commands(sub, (*prefix, name))


ALL = sorted({words: p for words, p in commands()}.items())


def test_every_command_is_found():
    names = {" ".join(w[1:]) for w, _ in ALL}
    assert {"tour", "floors", "lookup", "heads", "attend", "detect", "interpret detect"} <= names


@pytest.mark.parametrize("words, parser", ALL, ids=[" ".join(w[1:]) for w, _ in ALL])
def test_help_opens_with_what_and_where_and_ends_with_examples(words, parser):
    text = parser.format_help()
    first = " ".join(parser.description.split("\n")[0].split())
    assert first.startswith("Shows ") and first.endswith(")."), first
    assert any(f"the guide's section “{s}”" in first or f"the guide's opening, “{s}”" in first
               for s in GUIDE_SECTIONS) or "(beyond the guide: see docs/" in first, first
    assert first.count(". ") == 0, f"one sentence: {first}"
    if "beyond the guide: see docs/" in first:
        page = first.split("see ")[-1].rstrip(").")
        assert (ROOT / page).is_file(), page
    examples = help_examples(text)
    assert examples, text
    spellings = {" ".join(words), f"attnlab {words[-1]}"}              # `attnlab interpret detect` is `attnlab detect`
    assert all(any(e == s or e.startswith(s + " ") for s in spellings) for e in examples), examples
    assert text.rstrip().splitlines()[-1].strip().startswith("attnlab "), "the examples end the help"


@pytest.mark.skipif(not GUIDE.is_file(), reason="the guide's text is not on this machine")
def test_sections_are_the_guides_own_titles():
    plain = GUIDE.read_text().replace("$", "").replace("’", "'")          # the guide's TeX and typographic quote
    lines = {line.strip() for line in plain.splitlines()}
    assert all(s in lines for s in GUIDE_SECTIONS)


def test_add_command_refuses_a_command_without_its_sentence_or_examples():
    sub = argparse.ArgumentParser().add_subparsers()
    with pytest.raises(ValueError, match="section must be one of the guide's sections"):
        add_command(sub, "x", help="x", shows="Shows x", section="Nowhere", examples=("attnlab x",))
    with pytest.raises(ValueError, match="either section"):
        add_command(sub, "x", help="x", shows="Shows x", examples=("attnlab x",))
    with pytest.raises(ValueError, match="examples must be"):
        add_command(sub, "x", help="x", shows="Shows x", beyond="docs/x.md", examples=())


def test_help_examples_reads_the_epilog_without_comments():
    text = "usage: …\n\nexamples:\n  attnlab mask 8      # eight tokens\n  attnlab mask\n"
    assert help_examples(text) == ["attnlab mask 8", "attnlab mask"]


def is_slow(words, example: str = "") -> bool:
    """A slow command wherever it appears: in the command's words (``attnlab interpret ioi``) or the example's."""
    return bool(SLOW & (set(words[1:]) | set(shlex.split(example)[1:])))


FAST_EXAMPLES = list({e: (words, e) for words, p in ALL                            # each example once: `interpret
                      for e in help_examples(p.format_help()) if not is_slow(words, e)}.values())   # lens` too


def test_the_slow_filter_catches_slow_commands_wherever_they_appear():
    assert is_slow(("attnlab", "interpret", "ioi"), "attnlab ioi --prompts 4")
    assert is_slow(("attnlab", "interpret"), "attnlab interpret scan MY_TEXT.txt")
    assert not is_slow(("attnlab", "interpret"), "attnlab interpret lens '|abcab' --model induction")
    ran = {e for _, e in FAST_EXAMPLES}
    assert not any(is_slow((), e) for e in ran) and not any(" ioi" in e or " scan " in e for e in ran)


@pytest.mark.slow
@pytest.mark.parametrize("words, example", FAST_EXAMPLES, ids=[e.removeprefix("attnlab ") for _, e in FAST_EXAMPLES])
def test_examples_run_as_written(words, example, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "MY_TEXT.txt").write_text(MY_TEXT)
    code = main(shlex.split(example)[1:])
    out = capsys.readouterr()
    if code == 2 and ("not installed" in out.err or "No module named" in out.err or "install it" in out.err):
        pytest.skip(f"{example}: {out.err.strip()}")
    assert code == 0, f"{example}\n{out.err}"
    assert out.out.strip(), example


@pytest.mark.parametrize("words, parser", [(w, p) for w, p in ALL if is_slow(w)],
                         ids=[" ".join(w[1:]) for w, _ in ALL if is_slow(w)])
def test_slow_examples_parse(words, parser):
    for example in help_examples(parser.format_help()):
        args = build_parser().parse_args(shlex.split(example)[1:])
        assert hasattr(args, "func"), example
