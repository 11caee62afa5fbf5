"""The HTML view as text: self-contained, escaped, and carrying the weights faithfully (no browser)."""

import base64
import html
import json
import re
import zlib

import numpy as np
import pytest

from attnlab import AttentionMap, causal_mask
from attnlab import summarize_heads
from attnlab.viz import demo_map, render_html, save_html, show
from attnlab.viz import html as html_view

EVIL = "<script>alert(1)</script>"


@pytest.fixture
def amap(rng):
    return demo_map(["The", " cat", EVIL, "&amp;", "\u2028", " on"], rng=rng, n_layers=2)


def _data(page: str) -> dict:
    block = re.search(r'<script type="application/json" id="attnlab-data">(.*?)</script>', page, re.S)
    return json.loads(block.group(1))


def _unpack(b64: str, dtype) -> np.ndarray:
    return np.frombuffer(zlib.decompress(base64.b64decode(b64)), dtype=dtype)


def test_page_is_one_self_contained_file(amap):
    page = render_html(amap)
    assert not re.search(r"https?://|\bsrc=|\bhref=|@import|url\(|<link", page)   # nothing fetched
    assert page.count("<script") == 2 and page.count("</script") == 2            # the data block and the code
    assert "<style>" in page and "DecompressionStream" in page


def test_user_text_is_escaped(amap, rng):
    page = render_html(AttentionMap(tokens=amap.tokens, weights=amap.weights, keep=amap.keep,
                                    source='</script><script>alert(2)</script>'))
    assert EVIL not in page and "alert(2)</script>" not in page
    assert "&lt;/script&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in page                # title and header
    data = _data(page)
    assert data["tokens"] == list(amap.tokens)                                      # escaped, not altered
    assert data["source"] == '</script><script>alert(2)</script>'


def test_weights_and_mask_round_trip(amap):
    data = _data(render_html(amap))
    w = _unpack(data["weights"], "<u2").reshape(amap.weights.shape) / 65535        # (L, h, n_q, n_k)
    np.testing.assert_allclose(w, amap.weights, atol=0.5 / 65535 + 1e-12)
    keep = _unpack(data["keep"], np.uint8).reshape(amap.keep.shape)
    np.testing.assert_array_equal(keep.astype(bool), amap.keep)
    assert (data["n_layers"], data["n_heads"], data["n_q"], data["n_k"]) == amap.weights.shape
    assert _data(render_html(AttentionMap(tokens=("a",), weights=np.ones((1, 1)))))["keep"] is None


def test_summary_matches_a_loop(amap):
    s, (L, H, n, _) = summarize_heads(amap).table(), amap.weights.shape
    for layer in range(L):
        for head in range(H):
            a = amap.weights[layer, head]
            ent = np.mean([-sum(x * np.log(x) for x in row if x > 0) for row in a])
            assert s["entropy"][layer, head] == pytest.approx(ent)
            assert s["max"][layer, head] == pytest.approx(np.mean([max(row) for row in a]))
            assert s["self"][layer, head] == pytest.approx(np.mean([a[i, i] for i in range(n)]))
            assert s["prev"][layer, head] == pytest.approx(np.mean([a[i, i - 1] for i in range(1, n)]))
            assert s["first"][layer, head] == pytest.approx(np.mean(a[:, 0]))
    data = _data(render_html(amap))
    np.testing.assert_allclose(data["summary"]["entropy"], s["entropy"], atol=5e-5)


def test_summary_aligns_queries_bottom_right():
    a = np.array([[0.25, 0.25, 0.5], [0.0, 0.0, 1.0]])                      # 2 queries over 3 keys
    s = summarize_heads(AttentionMap(tokens=("a", "b", "c"), weights=a)).table()
    assert s["self"][0, 0] == pytest.approx((0.25 + 1.0) / 2)                  # query 0 is token 1
    assert s["prev"][0, 0] == pytest.approx((0.25 + 0.0) / 2)


def test_save_html_writes_the_page(tmp_path, amap):
    save_html(tmp_path / "view.html", amap)
    assert (tmp_path / "view.html").read_text(encoding="utf-8") == render_html(amap)
    with pytest.raises(FileNotFoundError) as e:
        save_html(tmp_path / "missing" / "view.html", amap)
    assert "missing" in str(e.value)
    with pytest.raises(IsADirectoryError):
        save_html(tmp_path, amap)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["view.html"]


def test_repr_html_is_the_page_in_an_iframe(amap):
    frame = show(amap)._repr_html_()
    assert frame.startswith("<iframe ") and 'sandbox="allow-scripts"' in frame
    srcdoc = re.search(r'srcdoc="([^"]*)"', frame).group(1)
    assert html.unescape(srcdoc) == render_html(amap)


def test_bad_input(monkeypatch, amap):
    with pytest.raises(TypeError, match="amap must be an attnlab.AttentionMap, got ndarray"):
        render_html(np.eye(2))
    monkeypatch.setattr(html_view, "MAX_HTML_CELLS", amap.weights.size - 1)
    with pytest.raises(ValueError, match=r"more than one page can hold"):
        render_html(amap)


def test_demo_map_bad_input():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator, got int"):
        demo_map(["a", "b"], rng=0)
    with pytest.raises(TypeError, match="config must be an AttentionConfig, got dict"):
        demo_map(["a", "b"], rng=np.random.default_rng(0), config={"d_model": 8})


def test_script_json_escapes_what_could_close_the_block():
    text = html_view.script_json({"t": "</script><!-- & \u2028"})
    assert not set("<>&\u2028") & set(text)
    assert json.loads(text) == {"t": "</script><!-- & \u2028"}


def test_causal_demo_has_zero_above_the_diagonal(amap):
    assert np.all(amap.weights[..., ~causal_mask(len(amap.tokens))] == 0)
    np.testing.assert_allclose(amap.weights.sum(-1), 1.0)


def _qk_map(rng):
    """An AttentionMap with the q and k its weights came from: softmax(q kᵀ / √d_head), causal."""
    q, k = rng.normal(size=(2, 3, 5, 4)), rng.normal(size=(2, 3, 5, 4))             # (L, h, n, d_head)
    s = np.where(causal_mask(5), q @ np.swapaxes(k, -1, -2) / 2.0, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return AttentionMap(tuple("abcde"), w / w.sum(-1, keepdims=True), keep=causal_mask(5), queries=q, keys=k)


def test_neuron_view_carries_q_and_k(rng):
    amap = _qk_map(rng)
    data = _data(render_html(amap))["neuron"]
    np.testing.assert_array_equal(_unpack(data["q"], "<f4").reshape(2, 3, 5, 4), amap.queries.astype(np.float32))
    np.testing.assert_array_equal(_unpack(data["k"], "<f4").reshape(2, 3, 5, 4), amap.keys.astype(np.float32))
    assert data["d_head"] == 4 and data["scale"] == 0.5
    assert _data(render_html(demo_map(["a", "b"], rng=rng)))["neuron"] is None
    with pytest.raises(ValueError, match="queries and keys go together"):
        AttentionMap(tuple("abcde"), amap.weights, queries=amap.queries)
    with pytest.raises(ValueError, match="queries and keys must be"):
        AttentionMap(tuple("abcde"), amap.weights, queries=amap.queries, keys=amap.keys[:, :, :4])


def test_attend_gives_the_q_and_k_of_its_weights(tmp_path, rng):
    """A model's AttentionMap carries hook_q and hook_k; the weights are their softmax (GQA keys repeated)."""
    from attnlab.models.attend import attend
    from attnlab.layer.config import AttentionConfig
    from attnlab.layer.positions import RoPE
    from attnlab.stack.transformer import ModelConfig, Transformer
    from attnlab.text.tokens import Vocab
    att = AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, n_ctx=16, positions=RoPE())
    model = Transformer.init(ModelConfig(vocab_size=6, n_layers=2, attention=att), rng=rng, std=0.5)
    tok = Vocab(tuple("abcdef"))
    r = attend("abcab", (model, tok))
    a = r.attentions
    s = np.where(causal_mask(5), a.queries @ np.swapaxes(a.keys, -1, -2) * a.scale, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(w / w.sum(-1, keepdims=True), a.weights, atol=1e-5)
