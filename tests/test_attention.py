import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnlab import attention, attention_weights, causal_mask, softmax

K = np.array([[0.0, 0.0], [2.0, 0.0], [1.0, 1.0]])   # keys of the, cat, sat
V = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])   # values of the, cat, sat
Q = np.array([[1.0, 0.0]])                          # query of sat


def attention_and_weights(q, k, v, **kw):
    """The output and the weights grid, from the two front doors."""
    return attention(q, k, v, **kw), attention_weights(q, k, **kw)


# --- the guide's hand example -------------------------------------------------------------

def test_guide_hand_example_unscaled():
    out, a = attention_and_weights(Q, K, V, scale=1.0)
    np.testing.assert_allclose(Q @ K.T, [[0, 2, 1]])
    assert [f"{w:.3f}" for w in a[0]] == ["0.090", "0.665", "0.245"]
    assert [f"{o:.3f}" for o in out[0]] == ["0.335", "0.910"]


def test_guide_hand_example_scaled_by_sqrt_dk():
    _, a = attention_and_weights(Q, K, V)     # default scale 1/sqrt(2)
    assert [f"{w:.3f}" for w in a[0]] == ["0.140", "0.576", "0.284"]


def test_score_of_20_is_a_hard_lookup():
    k = K.copy()
    k[1, 0] = 20.0
    out, a = attention_and_weights(Q, k, V, scale=1.0)
    assert a[0, 1] > 0.999999
    np.testing.assert_allclose(out[0], V[1], atol=1e-6)


def test_hand_computed_weights_equinox_style():
    # query [0, sqrt(2)] against identity keys, scale 1/sqrt(2): scores [0, 1] -> [1, e] / (1 + e)
    _, a = attention_and_weights(np.array([[0.0, np.sqrt(2)]]), np.eye(2), np.eye(2))
    np.testing.assert_allclose(a[0], np.array([1, np.e]) / (1 + np.e))


# --- semantics ----------------------------------------------------------------------------

def test_fully_masked_row_gives_zero_no_nan_no_warning(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    mask = np.ones((3, 5), bool)
    mask[1] = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, a = attention_and_weights(q, k, v, mask=mask)
    np.testing.assert_array_equal(out[1], 0)
    np.testing.assert_array_equal(a[1], 0)
    assert np.isfinite(out).all()


def test_bias_neginf_row_gives_zero(rng):
    q, k, v = rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    bias = np.zeros((2, 3))
    bias[0] = -np.inf
    out = attention(q, k, v, bias=bias)
    np.testing.assert_array_equal(out[0], 0)


def test_bias_is_added_to_scaled_scores(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))
    bias = rng.normal(size=(3, 5))
    _, a = attention_and_weights(q, k, v, bias=bias, scale=0.3)
    np.testing.assert_allclose(a, softmax(q @ k.T * 0.3 + bias), rtol=1e-12)


def test_is_causal_and_mask_are_anded(rng):
    q, k, v = rng.normal(size=(4, 3)), rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    mask = np.array([True, False, True, True])   # key padding: drop key 1
    _, a = attention_and_weights(q, k, v, mask=mask, is_causal=True)
    assert (a[:, 1] == 0).all()
    assert (a[np.triu_indices(4, 1)] == 0).all()
    np.testing.assert_allclose(a.sum(-1), 1)


def test_leading_axes_broadcast(rng):
    q = rng.normal(size=(2, 3, 5, 8))      # (B, h, n_q, d_k)
    k = rng.normal(size=(1, 3, 7, 8))      # shared over batch
    v = rng.normal(size=(7, 4))            # shared over batch and heads
    out = attention(q, k, v)
    assert out.shape == (2, 3, 5, 4)
    np.testing.assert_allclose(out[1, 2], attention(q[1, 2], k[0, 2], v))


def test_dtypes_preserved(rng):
    for dt in (np.float16, np.float32, np.float64):
        q, k, v = (rng.normal(size=(3, 4)).astype(dt) for _ in range(3))
        out, a = attention_and_weights(q, k, v)
        assert out.dtype == dt and a.dtype == dt


def test_check_finite_false_propagates_nan(rng):
    q, k, v = rng.normal(size=(2, 4)), rng.normal(size=(3, 4)), rng.normal(size=(3, 2))
    v[0, 0] = np.nan
    with np.errstate(invalid="ignore"):
        out = attention(q, k, v, check_finite=False)
    assert np.isnan(out[:, 0]).all()


# --- properties ---------------------------------------------------------------------------

sizes = st.integers(1, 6)
seeds = st.integers(0, 2**32 - 1)


@settings(max_examples=60, deadline=None)
@given(n_q=sizes, n_k=sizes, d=sizes, seed=seeds, p=st.floats(0.0, 1.0))
def test_rows_sum_to_one_where_any_key_visible_and_masked_weights_are_exactly_zero(n_q, n_k, d, seed, p):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n_q, d)), rng.normal(size=(n_k, d)), rng.normal(size=(n_k, d))
    mask = rng.random((n_q, n_k)) < p
    out, a = attention_and_weights(q, k, v, mask=mask)
    visible = mask.any(-1)
    np.testing.assert_allclose(a.sum(-1)[visible], 1.0, rtol=1e-12)
    assert (a[~mask] == 0).all()
    assert (out[~visible] == 0).all()


@settings(max_examples=40, deadline=None)
@given(n=sizes, n_k=sizes, d=sizes, seed=seeds)
def test_permuting_query_rows_permutes_outputs(n, n_k, d, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n, d)), rng.normal(size=(n_k, d)), rng.normal(size=(n_k, d))
    perm = rng.permutation(n)
    np.testing.assert_allclose(attention(q[perm], k, v), attention(q, k, v)[perm], rtol=1e-12, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(n=sizes, d=sizes, seed=seeds)
def test_self_attention_without_mask_is_permutation_equivariant(n, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    perm = rng.permutation(n)
    np.testing.assert_allclose(attention(x[perm], x[perm], x[perm]), attention(x, x, x)[perm],
                               rtol=1e-12, atol=1e-15)


@settings(max_examples=40, deadline=None)
@given(n_q=sizes, n_k=sizes, d=sizes, seed=seeds, causal=st.booleans())
def test_float32_agrees_with_float64(n_q, n_k, d, seed, causal):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n_q, d)), rng.normal(size=(n_k, d)), rng.normal(size=(n_k, d))
    ref = attention(q, k, v, is_causal=causal)
    got = attention(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), is_causal=causal)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=40, deadline=None)
@given(n_q=sizes, extra=st.integers(0, 5), d=sizes, seed=seeds)
def test_causal_alignment_when_fewer_queries_than_keys(n_q, extra, d, seed):
    # the last n_q queries of a full causal pass equal attending those queries against all keys
    rng = np.random.default_rng(seed)
    n_k = n_q + extra
    q, k, v = rng.normal(size=(n_k, d)), rng.normal(size=(n_k, d)), rng.normal(size=(n_k, d))
    full = attention(q, k, v, is_causal=True)
    tail = attention(q[-n_q:], k, v, is_causal=True)
    np.testing.assert_allclose(tail, full[-n_q:], rtol=1e-12, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(n_q=sizes, n_k=sizes, seed=seeds)
def test_fully_masked_rows_property(n_q, n_k, seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.normal(size=(n_q, 3)), rng.normal(size=(n_k, 3)), rng.normal(size=(n_k, 2))
    mask = np.zeros((n_q, n_k), bool)
    out, a = attention_and_weights(q, k, v, mask=mask)
    assert (out == 0).all() and (a == 0).all()


# --- bad input ----------------------------------------------------------------------------

def _qkv(rng):
    return rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(5, 2))


@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.complex128, object])
def test_refuses_non_float_inputs(rng, which, dtype):
    args = dict(zip(("query", "key", "value"), _qkv(rng)))
    args[which] = args[which].astype(dtype)
    with pytest.raises(TypeError, match=f"{which} must be a float array .* got dtype"):
        attention(**args)


def test_width_mismatch_message(rng):
    with pytest.raises(ValueError, match="key has width 32, query has width 64; they must match"):
        attention(rng.normal(size=(3, 64)), rng.normal(size=(5, 32)), rng.normal(size=(5, 2)))


def test_value_rows_must_match_keys(rng):
    with pytest.raises(ValueError, match="value has 4 rows, key has 5"):
        attention(rng.normal(size=(3, 4)), rng.normal(size=(5, 4)), rng.normal(size=(4, 2)))


def test_too_few_axes(rng):
    with pytest.raises(ValueError, match=r"query must have at least 2 axes, got shape \(4,\)"):
        attention(rng.normal(size=4), rng.normal(size=(5, 4)), rng.normal(size=(5, 2)))


def test_leading_axes_must_broadcast(rng):
    with pytest.raises(ValueError, match="leading axes .* do not broadcast"):
        attention(rng.normal(size=(2, 3, 4)), rng.normal(size=(3, 3, 4)), rng.normal(size=(3, 3, 2)))


@pytest.mark.parametrize("which", ["query", "key", "value"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_refuses_non_finite(rng, which, bad):
    args = dict(zip(("query", "key", "value"), _qkv(rng)))
    args[which][0, 0] = bad
    with pytest.raises(ValueError, match=f"{which} must be finite"):
        attention(**args)


def test_mask_must_be_bool_and_broadcast(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(TypeError, match="mask must be a bool array"):
        attention(q, k, v, mask=np.ones((3, 5)))
    with pytest.raises(ValueError, match=r"mask has shape \(3, 4\), which does not broadcast to .*\(3, 5\)"):
        attention(q, k, v, mask=np.ones((3, 4), bool))


def test_bias_must_be_float_broadcast_and_not_nan(rng):
    q, k, v = _qkv(rng)
    with pytest.raises(TypeError, match="bias must be a float array"):
        attention(q, k, v, bias=np.ones((3, 5), int))
    with pytest.raises(ValueError, match="bias has shape"):
        attention(q, k, v, bias=np.ones((2, 5)))
    with pytest.raises(ValueError, match="bias must be finite or -inf"):
        attention(q, k, v, bias=np.full((3, 5), np.nan))
    with pytest.raises(ValueError, match="bias must be finite or -inf"):     # checked as given, before it broadcasts
        attention(q, k, v, bias=np.array([[0.0, 0.0, np.inf, 0.0, 0.0]]))


@pytest.mark.parametrize("scale,exc", [(0.0, ValueError), (-1.0, ValueError), (np.inf, ValueError),
                                       ("x", TypeError), (True, TypeError)])
def test_bad_scale(rng, scale, exc):
    with pytest.raises(exc, match="scale must be a positive"):
        attention(*_qkv(rng), scale=scale)


def test_causal_mask_inside_attention_matches_explicit_mask(rng):
    q, k, v = rng.normal(size=(3, 4)), rng.normal(size=(6, 4)), rng.normal(size=(6, 2))
    np.testing.assert_array_equal(attention(q, k, v, is_causal=True), attention(q, k, v, mask=causal_mask(3, 6)))


@pytest.mark.parametrize("flag", ["yes", 1, None])
def test_is_causal_must_be_a_bool(rng, flag):
    with pytest.raises(TypeError, match="is_causal must be True or False"):
        attention(*_qkv(rng), is_causal=flag)


def test_finite_check_accepts_large_values_whose_sum_overflows():
    from attnlab.kernels._checks import check_finite
    check_finite("value", np.full((4, 2), 3e38, np.float32))       # the sum overflows, the values are finite
    big = np.full((4, 2), 3e38, np.float32)
    big[2, 1] = np.nan
    with pytest.raises(ValueError, match=r"value must be finite, got nan at index \(2, 1\)"):
        check_finite("value", big)
