"""The corpus scan: per-line statistics by hand, skipped lines counted, partial sums merged, and the same
averages from a Dask LocalCluster as from one process."""

import numpy as np
import pytest

from attnlab.interpret.scan import (STATS, ScanSums, is_punctuation, line_stats, read_corpus, scan_corpus,
                                    scan_lines)


def test_line_stats_by_hand():
    labels = ("[CLS]", "hi", ",", "[SEP]")
    ids = np.array([101, 7, 8, 102])
    a = np.zeros((1, 2, 4, 4))
    a[0, 0] = np.eye(4)                                  # head 0: every token on itself
    a[0, 1, :, 0] = 1.0                                  # head 1: everything on [CLS]
    s = line_stats(a, ids, labels)
    assert set(s) == set(STATS)
    np.testing.assert_allclose(s["cls"][0], [0.25, 1.0])
    np.testing.assert_allclose(s["sep"][0], [0.25, 0.0])
    np.testing.assert_allclose(s["punctuation"][0], [0.25, 0.0])
    np.testing.assert_allclose(s["entropy"][0], [0.0, 0.0])
    np.testing.assert_allclose(s["distance"][0], [0.0, (0 + 1 + 2 + 3) / 4])
    np.testing.assert_allclose(s["previous_token"][0], [0.0, 0.25])   # row 1 -> 0 is the previous token


def test_punctuation_labels():
    assert is_punctuation(",") and is_punctuation("Ġ.") and is_punctuation("...") and is_punctuation("”")
    assert not is_punctuation("cat") and not is_punctuation("Ġ") and not is_punctuation("[SEP]")


def test_sums_merge_and_average():
    one = ScanSums({k: np.ones((1, 1)) for k in STATS}, lines=1, tokens=3)
    two = ScanSums({k: np.full((1, 1), 3.0) for k in STATS}, lines=1, tokens=4, too_long=2)
    merged = ScanSums().add(one).add(two)
    assert merged.lines == 2 and merged.tokens == 7 and merged.too_long == 2
    assert all(v[0, 0] == 2.0 for v in merged.means().values())
    with pytest.raises(ValueError, match="no line could be scanned"):
        ScanSums(too_long=3).means()


@pytest.fixture(scope="module")
def own_folder(tmp_path_factory):
    from attnlab.lm.checkpoint import save_checkpoint
    from attnlab.lm.model import lm_config
    from attnlab.stack.transformer import Transformer
    from attnlab.text.tokens import Vocab
    vocab = Vocab.from_text("abcdefgh ,.")
    model = Transformer.init(lm_config(vocab.size, d_model=8, n_heads=2, n_layers=2, n_ctx=12),
                             rng=np.random.default_rng(0), std=0.5)
    return save_checkpoint(model, vocab, tmp_path_factory.mktemp("own") / "lm")


LINES = ["abc, def.", "a", "abcdefgh abcdefgh", "hgf edc", "ba ab", "cab, bad.", "fed cba", "g"] * 3


def test_scan_in_one_process_equals_line_by_line(own_folder):
    from attnlab.interpret.detect import model_patterns
    from attnlab.models import load_model
    model, tok = load_model(own_folder)
    seen = []
    sums = scan_corpus(str(own_folder), LINES, chunk_size=5, on_progress=lambda d, t: seen.append((d, t)))
    assert seen[-1] == (len(LINES), len(LINES))
    assert sums.too_long == 3 and sums.too_short == 6 and sums.lines == 15
    kept = [t for t in LINES if 2 <= len(t) <= 12]
    by_hand = {k: np.mean([line_stats(model_patterns(model, tok.encode(t)).astype(float), tok.encode(t),
                                      tok.labels(tok.encode(t)))[k] for t in kept], axis=0) for k in STATS}
    for k in STATS:
        np.testing.assert_allclose(sums.means()[k], by_hand[k], rtol=1e-12, atol=1e-12)
    assert scan_lines(model, tok, ["abc"]).lines == 1


def test_scan_on_a_local_cluster_matches_one_process(own_folder):
    pytest.importorskip("distributed")
    from attnlab.interpret.scan import scan_cluster
    alone = scan_corpus(str(own_folder), LINES, chunk_size=4)
    cluster, client = scan_cluster(2)
    try:
        spread = scan_corpus(str(own_folder), LINES, client=client, chunk_size=4)
    finally:
        client.close()
        cluster.close()
    assert (spread.lines, spread.too_long, spread.too_short) == (alone.lines, alone.too_long, alone.too_short)
    for k in STATS:
        np.testing.assert_allclose(spread.means()[k], alone.means()[k], rtol=1e-12, atol=1e-12)


def test_read_corpus(tmp_path):
    (tmp_path / "c.txt").write_text("one line\n\n  two  \n", encoding="utf-8")
    assert read_corpus(tmp_path / "c.txt") == ["one line", "two"]
    (tmp_path / "e.txt").write_text("\n \n", encoding="utf-8")
    with pytest.raises(ValueError, match="no non-blank line"):
        read_corpus(tmp_path / "e.txt")
    with pytest.raises(OSError):
        read_corpus(tmp_path / "missing.txt")
