"""The scan never aborts on one bad line (issue 26): bad UTF-8, binary and blank lines are skipped, counted by
kind, and listed by line number in --json."""

import json

import pytest

from attnlab.cli import main
from attnlab.interpret.scan import read_corpus_lines

CORPUS = (b"the cat sat on the mat\n"      # 1
          b"\n"                            # 2 blank
          b"bad \xff byte here\n"          # 3 not UTF-8 (0xff never appears in UTF-8)
          b"half \xe2\x82 a euro sign\n"   # 4 not UTF-8 (a cut-off 3-byte sequence)
          b"nul\x00 inside\n"              # 5 binary
          b"   \t \r\n"                    # 6 blank (spaces, a tab, a Windows line end)
          b"\x89PNG\r\n"                   # 7 not UTF-8 (a PNG's first bytes)
          b"the dog ran\r\n")              # 8, a Windows line end stripped


def test_each_bad_line_is_skipped_and_counted_by_kind(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_bytes(CORPUS)
    lines, skipped = read_corpus_lines(path)
    assert lines == ["the cat sat on the mat", "the dog ran"]
    assert skipped == {"blank": [2, 6], "not_utf8": [3, 4, 7], "binary": [5]}


def test_the_scan_cli_lists_the_skipped_line_numbers(tmp_path, capsys):
    pytest.importorskip("tokenizers")
    path = tmp_path / "corpus.txt"
    path.write_bytes(CORPUS)
    assert main(["scan", str(path), "--workers", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lines"] == 2
    assert out["skipped_lines"] == {"blank": {"count": 2, "line_numbers": [2, 6]},
                                    "not_utf8": {"count": 3, "line_numbers": [3, 4, 7]},
                                    "binary": {"count": 1, "line_numbers": [5]}}
    assert main(["scan", str(path), "--workers", "0"]) == 0
    assert "skipped 2 blank lines (line 2, 6), 3 not-utf8 lines (line 3, 4, 7), 1 binary line (line 5)" \
        in capsys.readouterr().out
