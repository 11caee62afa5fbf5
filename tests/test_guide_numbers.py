"""Every number the guide prints, through the library (attnlab.guide), plus the properties behind them."""

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import AttentionConfig
from attnlab import guide as g

# --- references written the guide's way, independent of attnlab ------------------------------------


def floors_reference(tokens, max_k):
    """The guide's Counter loop, over any list of tokens."""
    rows = []
    for k in range(max_k + 1):
        start = max(k, 1)
        if start >= len(tokens):
            break
        seen = Counter((tuple(tokens[i - k:i]), tokens[i]) for i in range(start, len(tokens)))
        context = Counter()
        for (c, _), count in seen.items():
            context[c] += count
        floor = -sum(n * np.log(n / context[c]) for (c, _), n in seen.items()) / sum(seen.values())
        rows.append((k, floor, len(context)))
    return rows


def softmax_ref(z):
    z = z - z.max(axis=-1, keepdims=True)
    return np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)


def attention_ref(X, WQ, WK, WV, causal=True):
    Q, K, V = X @ WQ, X @ WK, X @ WV
    S = Q @ K.T / np.sqrt(K.shape[1])
    M = np.triu(np.full(S.shape, -np.inf), k=1) if causal else 0
    A = softmax_ref(S + M)
    return A @ V, A


def f3(a):
    return np.array2string(np.asarray(a), precision=3, floatmode="fixed", suppress_small=True)


@pytest.fixture(scope="module")
def toy():
    return g.guide_toy()


# --- 1. floors -------------------------------------------------------------------------------------

def test_floors_guide_table():
    rows = [(r.k, f"{r.floor:.3f}", r.n_contexts) for r in g.floors(g.TOY_TEXT, 5)]
    assert rows == [(0, "2.318", 1), (1, "0.884", 15), (2, "0.337", 32), (3, "0.296", 46),
                    (4, "0.212", 59), (5, "0.179", 69)]
    assert len(g.TOY_TEXT) == 128
    assert [r.n_predictions for r in g.floors(g.TOY_TEXT, 5)] == [127, 127, 126, 125, 124, 123]


@settings(max_examples=60, deadline=None)
@given(st.text(alphabet="ab c\né🙂", max_size=60), st.integers(0, 7))
def test_floors_match_the_guides_counter_loop(text, max_k):
    got = [(r.k, r.floor, r.n_contexts) for r in g.floors(text, max_k)]
    want = floors_reference(list(text), max_k)
    assert [(k, n) for k, _, n in got] == [(k, n) for k, _, n in want]
    np.testing.assert_allclose([f for _, f, _ in got], [f for _, f, _ in want], atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.sampled_from(["the", "cat", "sat", "dog", "a"]), max_size=40), st.integers(0, 5))
def test_word_floors_match_reference(words, max_k):
    got = [(r.k, round(r.floor, 10), r.n_contexts) for r in g.floors(" ".join(words), max_k, level="word")]
    want = [(k, round(f, 10), n) for k, f, n in floors_reference(words, max_k)]
    assert got == want


def test_floors_renumber_contexts_when_packed_keys_would_overflow():
    # 3000 distinct characters need 12 bits each; k = 6 contexts plus the next one do not fit in 63 bits
    rng = np.random.default_rng(5)
    text = "".join(chr(0x4E00 + int(c)) for c in rng.integers(0, 3000, 4000))
    text = text + text[:500]                            # some repeats, so floors are not all 0
    got = [(r.k, r.floor, r.n_contexts) for r in g.floors(text, 7)]
    want = floors_reference(list(text), 7)
    assert [(k, n) for k, _, n in got] == [(k, n) for k, _, n in want]
    np.testing.assert_allclose([f for _, f, _ in got], [f for _, f, _ in want], atol=1e-12)


def test_floors_never_rise_with_more_context_on_the_same_positions():
    rows = g.floors(g.TOY_TEXT, 8)
    assert all(r.floor >= 0 for r in rows)
    assert rows[0].floor >= rows[1].floor >= rows[2].floor


def test_floors_stop_when_text_runs_out():
    assert [r.k for r in g.floors("abc", 8)] == [0, 1, 2]
    assert g.floors("", 3) == [] and g.floors("a", 3) == []


def test_encode():
    codes, symbols = g.encode("b a b", level="word")
    assert codes.tolist() == [1, 0, 1] and symbols == ("a", "b")
    codes, symbols = g.encode("é🙂é")
    assert codes.tolist() == [0, 1, 0] and symbols == ("é", "🙂")


def test_floors_bad_input(tmp_path):
    with pytest.raises(ValueError, match="max_k must be an integer >= 0, got -1"):
        g.floors("abc", -1)
    with pytest.raises(TypeError, match="max_k"):
        g.floors("abc", 2.0)
    with pytest.raises(ValueError, match="level must be one of 'char', 'word', got 'byte'"):
        g.floors("abc", 2, level="byte")
    with pytest.raises(TypeError, match="text must be a str"):
        g.floors(b"abc", 2)
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(ValueError, match="is not UTF-8 text: byte 0xe9 at offset 3"):
        g.read_utf8(bad)
    with pytest.raises(FileNotFoundError):
        g.read_utf8(tmp_path / "missing.txt")


# --- 2. lookup -------------------------------------------------------------------------------------

def test_soft_lookup_guide_numbers():
    r = g.soft_lookup()
    assert (f3(r.scores), f3(r.weights), f3(r.output)) == ("[0.000 2.000 1.000]", "[0.090 0.665 0.245]",
                                                          "[0.335 0.910]")
    np.testing.assert_allclose(r.products.sum(axis=1), r.scores)
    np.testing.assert_allclose(r.output, r.weights @ r.values)
    assert f3(g.soft_lookup(scaled=True).weights) == "[0.140 0.576 0.284]"


def test_hard_lookup_score_20():
    w, out = g.hard_lookup()
    assert w[1] > 0.999999 and f"{w[1]:.8f}" == "0.99999999"
    np.testing.assert_allclose(out, g.lookup.VALUES[1], atol=1e-6)


def test_lookup_bad_input():
    with pytest.raises(ValueError, match="key has width 2, query has width 3"):
        g.soft_lookup(np.array([1., 0., 0.]))
    with pytest.raises(ValueError, match="value has 2 rows, key has 3"):
        g.soft_lookup(values=np.array([[1., 0.], [0., 1.]]))
    with pytest.raises(ValueError, match="query must be one vector"):
        g.soft_lookup(np.ones((2, 2)))
    with pytest.raises(ValueError, match="index must pick one of the 3 scores"):
        g.hard_lookup(index=5)
    for bad in (float("nan"), float("inf")):                # a softmax of them would be NaN, silently
        with pytest.raises(ValueError, match="score must be a finite number"):
            g.hard_lookup(score=bad)
    with pytest.raises(TypeError, match="score must be a finite number, got str"):
        g.hard_lookup(score="20")


def test_explain_and_shapes_bad_input():
    with pytest.raises(TypeError, match="config must be an AttentionConfig, got str"):
        g.shapes(5, "gpt2-small")
    with pytest.raises(TypeError, match=r"toy must be a GuideToy \(see guide_toy\(\)\), got NoneType"):
        g.explain(None, "the cat")
    with pytest.raises(ValueError, match="tokens must be labels with at least one visible character"):
        g.mask_table(["the", " "])


# --- 3. explain and shapes ---------------------------------------------------------------------------

def test_gpt2_shapes_table():
    got = {s.symbol.name: (s.symbol.shape, s.shape) for s in g.shapes(5)}
    assert got["X"] == (("n", "d_model"), (5, 768))
    assert got["W^Q"] == (("d_model", "d_k"), (768, 64))
    assert got["W^V"] == (("d_model", "d_v"), (768, 64))
    assert got["Q"] == (("n", "d_k"), (5, 64))
    assert got["Kᵀ"] == (("d_k", "n"), (64, 5))
    assert got["S"][1] == got["M"][1] == got["A"][1] == (5, 5)
    assert got["AV"] == (("n", "d_v"), (5, 64))
    assert g.shape_sizes(5) == {"n": 5, "d_model": 768, "d_k": 64, "d_v": 64}


def test_explain_symbol_by_symbol_against_the_guides_code(toy):
    steps = {s.symbol.name: s.value for s in g.explain(toy, "the cat sat")}
    X = toy.embeddings.embed("the cat sat")
    out, A = attention_ref(X, toy.W_Q, toy.W_K, toy.W_V)
    np.testing.assert_allclose(steps["A"], A, rtol=1e-12)
    np.testing.assert_allclose(steps["AV"], out, rtol=1e-12)
    np.testing.assert_allclose(steps["S"], X @ toy.W_Q @ (X @ toy.W_K).T / 2, rtol=1e-12)
    assert np.isneginf(steps["M"][0, 1]) and steps["M"][1, 0] == 0
    np.testing.assert_array_equal(steps["S + M"], steps["S"] + steps["M"])
    assert f3(steps["A"]) == "[[1.000 0.000 0.000]\n [0.619 0.381 0.000]\n [0.757 0.140 0.103]]"
    unmasked = {s.symbol.name: s.value for s in g.explain(toy, "the cat sat", is_causal=False)}
    assert (unmasked["M"] == 0).all() and (unmasked["A"] > 0).all()


def test_mask_table():
    m = g.mask_table(["The", "cat", "sat"])
    np.testing.assert_array_equal(m.keep, np.tril(np.ones((3, 3), bool)))
    np.testing.assert_array_equal(m.M, np.triu(np.full((3, 3), -np.inf), k=1))
    with pytest.raises(ValueError, match="at least one token"):
        g.mask_table([])
    with pytest.raises(TypeError, match="tokens must be a sequence of str"):
        g.mask_table("The cat")


# --- 4. scaling ----------------------------------------------------------------------------------

def test_scale_guide_numbers():
    spreads = g.dot_product_spread(rng=np.random.default_rng(0))
    assert [(s.d_k, f"{s.std:.2f}") for s in spreads] == [(4, "1.98"), (64, "8.01")]
    t = g.top_weight(rng=np.random.default_rng(0))
    assert (f"{t.mean:.3f}", f"{t.mean_scaled:.3f}") == ("0.843", "0.247")
    assert [f"{w:.5f}" for w in g.saturation((10.0, 0.0, 0.0))] == ["0.99991", "0.99992"]
    assert [f"{w:.3f}" for w in g.saturation((1.0, 0.0, 0.0))] == ["0.576", "0.600"]


def test_top_weight_follows_the_guides_draw_order():
    rng = np.random.default_rng(0)
    top = []
    for _ in range(50):
        q = rng.normal(size=64)
        K = rng.normal(size=(16, 64))
        top.append(softmax_ref(K @ q).max())
    np.testing.assert_allclose(g.top_weight(n_trials=50, rng=np.random.default_rng(0)).top, top, rtol=1e-12)


def test_top_weight_in_blocks_is_the_trial_by_trial_draw(monkeypatch):
    from attnlab.guide import scaling
    monkeypatch.setattr(scaling, "TRIAL_NUMBERS", 3 * 5 * 4)        # 3 trials of (1 + 4 keys) × width 5 a draw
    rng = np.random.default_rng(7)
    top, top_scaled = [], []
    for _ in range(11):                                            # 3 + 3 + 3 + 2: a short last block
        q, K = rng.normal(size=5), rng.normal(size=(4, 5))
        top.append(softmax_ref(K @ q).max())
        top_scaled.append(softmax_ref(K @ q / np.sqrt(5)).max())
    t = g.top_weight(5, 4, 11, rng=np.random.default_rng(7))
    np.testing.assert_allclose(t.top, top, rtol=1e-12)
    np.testing.assert_allclose(t.top_scaled, top_scaled, rtol=1e-12)


@settings(max_examples=10, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([1, 9, 25, 100]))
def test_spread_is_close_to_sqrt_width_for_any_seed(seed, d_k):
    (s,) = g.dot_product_spread((d_k,), n_pairs=4000, rng=np.random.default_rng(seed))
    assert abs(s.std / np.sqrt(d_k) - 1) < 0.1


def test_scaling_bad_input():
    with pytest.raises(TypeError, match="rng must be a numpy.random.Generator"):
        g.top_weight(rng=0)
    with pytest.raises(ValueError, match="n_pairs must be a positive integer"):
        g.dot_product_spread(n_pairs=0, rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="nudge must be a finite number, got nan"):
        g.saturation(nudge=float("nan"))


# --- 5/6. toy embeddings and the grids ------------------------------------------------------------

def test_toy_vocab_and_pairs():
    vocab = g.toy.toy_vocab()
    assert len(vocab) == 12 and list(vocab) == sorted(vocab)
    ids = np.array([vocab.index(w) for w in g.TOY_TEXT.split()])
    guide_pairs = [(ids[i], ids[j]) for i in range(33) for j in range(max(0, i - 2), min(33, i + 3)) if i != j]
    inputs, targets = g.toy.skipgram_pairs(ids, 2)
    assert list(zip(inputs.tolist(), targets.tolist())) == [(int(a), int(b)) for a, b in guide_pairs]
    assert len(inputs) == 126


def test_embeddings_cosine(toy):
    assert toy.embeddings.E.shape == (12, 4)
    assert f"{toy.embeddings.cosine('cat', 'dog'):.2f}" == "0.95"


def test_training_matches_the_guides_loop_for_a_few_steps():
    vocab = g.toy.toy_vocab()
    ids = np.array([vocab.index(w) for w in g.TOY_TEXT.split()])
    inputs, targets = g.toy.skipgram_pairs(ids, 2)
    rng = np.random.default_rng(0)
    E, W = rng.normal(0, 0.1, (12, 4)), rng.normal(0, 0.1, (4, 12))
    for _ in range(20):
        dz = softmax_ref(E[inputs] @ W)
        dz[np.arange(126), targets] -= 1
        dW = E[inputs].T @ dz / 126
        dE = np.zeros_like(E)
        np.add.at(dE, inputs, dz @ W.T / 126)
        E -= 0.5 * dE
        W -= 0.5 * dW
    got = g.train_embeddings(config=g.SkipGramConfig(steps=20), rng=np.random.default_rng(0))
    np.testing.assert_allclose(got.E, E, rtol=1e-12)


def test_guide_weight_grids(toy):
    _, a3 = toy.attend("the cat sat")
    assert f3(a3) == "[[1.000 0.000 0.000]\n [0.619 0.381 0.000]\n [0.757 0.140 0.103]]"
    assert f3(a3.sum(axis=1)) == "[1.000 1.000 1.000]"
    _, a5 = toy.attend("the cat sat on the")
    assert f3(a5) == ("[[1.000 0.000 0.000 0.000 0.000]\n [0.619 0.381 0.000 0.000 0.000]\n"
                      " [0.757 0.140 0.103 0.000 0.000]\n [0.042 0.017 0.899 0.042 0.000]\n"
                      " [0.081 0.215 0.135 0.488 0.081]]")


def test_projections_drawn_as_the_guide(toy):
    rng = np.random.default_rng(1)
    WQ, WK, WV = (rng.normal(0, 0.5, (4, 4)) for _ in range(3))
    for got, want in ((toy.W_Q, WQ), (toy.W_K, WK), (toy.W_V, WV)):
        np.testing.assert_array_equal(got, want)


def test_self_attention_matches_guide_code_float64(rng):
    x = rng.normal(size=(6, 4))
    WQ, WK, WV = g.random_projections(4, 3, 5, rng=rng)
    for causal in (True, False):
        out, a = g.self_attention(x, WQ, WK, WV, is_causal=causal)
        out_ref, a_ref = attention_ref(x, WQ, WK, WV, causal)
        np.testing.assert_allclose(a, a_ref, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(out, out_ref, rtol=1e-12, atol=1e-15)


def test_word_outside_vocabulary_is_named(toy):
    with pytest.raises(ValueError, match="word 'cow' is not in the toy vocabulary"):
        toy.embeddings.embed("the cow sat")
    np.testing.assert_array_equal(toy.attend("The cat sat")[1], toy.attend("the cat sat")[1])   # the guide's own
    with pytest.raises(ValueError, match="word 'cow'"):
        toy.attend("The Cow sat")
    with pytest.raises(ValueError, match="word_b must be one word, got 'dog cat'"):
        toy.embeddings.cosine("cat", "dog cat")
    with pytest.raises(ValueError, match="at least one word"):
        toy.embeddings.embed("  ")
    with pytest.raises(ValueError, match="W_Q must be"):
        g.self_attention(np.ones((2, 4)), np.ones((3, 3)), np.ones((4, 3)), np.ones((4, 3)))


# --- 7. heads --------------------------------------------------------------------------------------

def test_heads_shapes_and_params():
    run = g.run_heads(rng=np.random.default_rng(0))
    assert list(run.shapes.values()) == [(12, 5, 64), (12, 5, 5), (12, 5, 64), (5, 768), (5, 768)]
    assert run.n_params == 2_362_368
    np.testing.assert_allclose(run.weights.sum(axis=-1), 1.0)
    assert np.all(np.triu(run.weights, k=1) == 0)


def test_heads_match_the_guides_block():
    n, d_model, h = 5, 768, 12
    rng = np.random.default_rng(0)
    X = rng.normal(size=(n, d_model))
    WQ, WK, WV, WO = (rng.normal(0, 0.02, (d_model, d_model)) for _ in range(4))
    split = lambda Z: Z.reshape(n, h, 64).transpose(1, 0, 2)   # noqa: E731
    Q, K, V = split(X @ WQ), split(X @ WK), split(X @ WV)
    A = softmax_ref(Q @ K.transpose(0, 2, 1) / 8 + np.triu(np.full((n, n), -np.inf), k=1))
    y = (A @ V).transpose(1, 0, 2).reshape(n, d_model) @ WO
    run = g.run_heads(rng=np.random.default_rng(0))
    np.testing.assert_allclose(run.weights, A, rtol=1e-10)
    np.testing.assert_allclose(run.y, y, rtol=1e-10, atol=1e-14)


# --- 8. order --------------------------------------------------------------------------------------

def test_order_checks_guide_numbers(toy):
    r = g.order_checks(toy, rng=np.random.default_rng(2))
    assert (r.reversal_commutes, r.same_vector) == (True, True)
    assert (r.with_positions_commutes, f"{r.with_positions_max_diff:.3f}") == (False, "0.749")
    assert (r.masked_same_vector, f"{r.masked_max_diff:.3f}") == (False, "0.020")
    assert r.word == "saw"


def test_order_bad_input(toy):
    with pytest.raises(ValueError, match="swapped must have as many words"):
        g.order_checks(toy, swapped="the dog saw", rng=np.random.default_rng(2))
    with pytest.raises(ValueError, match="index must be a position from 0 to 4"):
        g.order_checks(toy, index=7, rng=np.random.default_rng(2))


# --- 9. cost ---------------------------------------------------------------------------------------

def test_cost_guide_numbers():
    p = g.params()
    assert (p.per_layer, p.per_layer_with_bias, p.position_table) == (2_359_296, 2_362_368, 786_432)
    c5, c1024 = g.cost(5), g.cost(1024)
    assert (c5.scores_per_head, c5.scores_per_layer) == (25, 300)
    assert (c1024.scores_per_head, c1024.scores_per_layer) == (1_048_576, 12_582_912)


def test_cost_beyond_the_guide():
    # KV cache: 2 (K and V) × 12 layers × 768 numbers × 4 bytes per token; GPT-2 at n_ctx: 72 MiB
    assert g.kv_bytes_per_token() == 73_728
    assert g.cost(1024).kv_cache_bytes == 72 * 2**20
    c = g.cost(1024)
    assert c.grid_bytes_naive == 12 * 1024 * 1024 * 4                 # 48 MiB of float32 scores
    assert c.grid_bytes_tiled == (2 * 512 * 512 + 2 * 12 * 1024) * 4    # 2 workers' 512 × 512 tiles, m and l
    # FLOPs: projections 4 × (2 n d_model²), QKᵀ and AV 2 × (2 h n² d_head)
    assert c.flops_projections == 4 * 2 * 1024 * 768 * 768
    assert c.flops_scores == 2 * 2 * 12 * 1024 * 1024 * 64
    assert c.flops_per_model == 12 * c.flops_per_layer


@pytest.mark.parametrize("n", [1, 5, 128, 200, 1024, 4096, 65_536])
def test_tiled_grid_bytes_are_the_tiled_kernels_score_buffers(n):
    from attnlab.kernels.tiled import BLOCK_K, BLOCK_Q, Plan, Scratch
    plan = Plan(n_q=n, n_k=n, block_q=BLOCK_Q, block_k=BLOCK_K, is_causal=True)
    scratch = Scratch(plan, 64, 64, np.float32)            # what one worker of the kernel allocates
    m_and_l = 2 * 12 * n * 4                               # a running max and sum per query of 12 heads
    assert g.cost(n).grid_bytes_tiled == 2 * scratch.s.nbytes + m_and_l
    assert g.tile_shape(n) == (min(n, BLOCK_Q), min(n, BLOCK_K))
    one_worker = g.CostConfig(attention=AttentionConfig(d_model=64, n_heads=1), workers=4)
    if n <= BLOCK_Q:                                       # one head, one query block: one work item, one worker
        assert g.cost(n, one_worker).grid_bytes_tiled == scratch.s.nbytes + 2 * n * 4


def test_growth_table_is_quadratic_for_scores_linear_for_the_cache():
    rows = g.growth()
    assert [r.n for r in rows] == [2**i for i in range(21)] and rows[-1].n == 1_048_576
    for a, b in zip(rows, rows[1:]):
        assert b.scores_per_layer == 4 * a.scores_per_layer
        assert b.kv_cache_bytes == 2 * a.kv_cache_bytes
        assert b.grid_bytes_naive == 4 * a.grid_bytes_naive
    big = [r for r in rows if r.n >= 256]
    assert all(r.grid_bytes_tiled < r.grid_bytes_naive / 3 for r in big)
    assert [r.n for r in g.growth(n_max=5)] == [1, 2, 4, 5]


def test_cost_bad_input():
    with pytest.raises(ValueError, match="n must be a positive integer, got 0"):
        g.cost(0)
    with pytest.raises(ValueError, match="n_layers must be a positive integer"):
        g.CostConfig(n_layers=0)
    with pytest.raises(TypeError, match="attention must be an AttentionConfig"):
        g.CostConfig(attention="gpt2")

