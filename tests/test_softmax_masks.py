import numpy as np
import pytest

from attnlab import additive_mask, causal_mask, softmax


def test_softmax_guide_values():
    # Guide 1: softmax turned [2, 1, 0] into 0.665, 0.245, 0.090
    np.testing.assert_allclose(softmax(np.array([2.0, 1.0, 0.0])), [0.665, 0.245, 0.090], atol=5e-4)


def test_softmax_is_stable_for_huge_scores():
    w = softmax(np.array([1000.0, 0.0, -1000.0]))
    assert np.all(np.isfinite(w))
    np.testing.assert_allclose(w, [1.0, 0.0, 0.0])


def test_softmax_float16_in_float16_out():
    x = np.array([[0.0, 2.0, 1.0], [30000.0, 30000.0, 0.0]], dtype=np.float16)
    w = softmax(x)
    assert w.dtype == np.float16
    np.testing.assert_allclose(w.astype(np.float64), softmax(x.astype(np.float64)), atol=1e-3)


def test_softmax_all_neginf_row_is_zero_without_warning():
    x = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    with np.errstate(all="raise"):
        w = softmax(x)
    np.testing.assert_array_equal(w, [[0.0, 0.0], [1.0, 0.0]])


def test_softmax_other_axis():
    x = np.array([[0.0, 1.0], [0.0, 1.0]])
    np.testing.assert_allclose(softmax(x, axis=0), 0.5)


@pytest.mark.parametrize("bad", [np.arange(3), np.array([True, False]), np.array([1j, 2j]), "abc"])
def test_softmax_refuses_non_float(bad):
    with pytest.raises(TypeError, match="x must be a float array"):
        softmax(bad)


def test_causal_mask_square():
    np.testing.assert_array_equal(causal_mask(3), np.tril(np.ones((3, 3), bool)))
    assert causal_mask(3).dtype == np.bool_


def test_causal_mask_bottom_right_alignment():
    m = causal_mask(2, 5)
    np.testing.assert_array_equal(m, [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])


def test_causal_mask_more_queries_than_keys_masks_first_rows():
    m = causal_mask(3, 2)
    np.testing.assert_array_equal(m, [[0, 0], [1, 0], [1, 1]])


def test_causal_mask_window():
    m = causal_mask(5, window=2)
    expected = np.array([[abs(i - j) < 2 and j <= i for j in range(5)] for i in range(5)])
    np.testing.assert_array_equal(m, expected)
    np.testing.assert_array_equal(causal_mask(1, 6, window=3), [[0, 0, 0, 1, 1, 1]])


@pytest.mark.parametrize("args,kw,exc,msg", [
    ((0,), {}, ValueError, "n_q must be a positive integer, got 0"),
    ((2.5,), {}, TypeError, "n_q must be a positive integer"),
    ((2, -1), {}, ValueError, "n_k must be a positive integer"),
    ((2,), {"window": 0}, ValueError, "window must be a positive integer"),
    ((True,), {}, TypeError, "n_q"),
])
def test_causal_mask_bad_input(args, kw, exc, msg):
    with pytest.raises(exc, match=msg):
        causal_mask(*args, **kw)


def test_additive_mask_matches_guide_M():
    M = np.triu(np.full((5, 5), -np.inf), k=1)
    np.testing.assert_array_equal(additive_mask(causal_mask(5)), M)
    with pytest.raises(TypeError, match="mask must be a bool array"):
        additive_mask(np.ones((2, 2)))


def test_causal_mask_q_offset():
    keep = causal_mask(2, 5, q_offset=1, window=2)
    np.testing.assert_array_equal(keep.astype(int), [[1, 1, 0, 0, 0], [0, 1, 1, 0, 0]])
    assert not causal_mask(2, 3, q_offset=-2).any()
    np.testing.assert_array_equal(causal_mask(3, 5, q_offset=2), causal_mask(3, 5))
