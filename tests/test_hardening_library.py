"""The library's own entry points as untrusted input meets them (issue 31): the samplers check every argument
(cause 6), the research tools take heads as integers in range only (cause 7), and the tiled kernel answers an
empty query set as ``attention`` does (cause 9)."""

import warnings

import numpy as np
import pytest

from attnlab import attention
from attnlab.interpret import ablation_hooks, path_patch
from attnlab.kernels.tiled import tiled_attention
from attnlab.lm.model import lm_config
from attnlab.stack.sampling import next_token_probabilities, sample_next
from attnlab.stack.transformer import Transformer, generate

LOGITS = np.log(np.array([0.05, 0.4, 0.1, 0.25, 0.2]))


# --- 6. sampling -----------------------------------------------------------------------------------------------

BAD_DRAWS = [
    ("temperature -1", {"temperature": -1.0}, "temperature must be a number >= 0"),
    ("temperature NaN", {"temperature": float("nan")}, "temperature must be a number >= 0"),
    ("temperature inf", {"temperature": float("inf")}, "temperature must be a number >= 0"),
    ("temperature 1e-320", {"temperature": 1e-320}, r"temperature 1e-320 is too small to divide by"),
    ("temperature True", {"temperature": True}, "temperature must be a number"),
    ("top_p 0", {"top_p": 0.0}, r"top_p must be None or a number in \(0, 1\]"),
    ("top_p NaN", {"top_p": float("nan")}, r"top_p must be None or a number in \(0, 1\]"),
    ("top_k 0", {"top_k": 0}, "top_k must be None or an integer from 1 to the vocabulary size 5"),
    ("top_k -2", {"top_k": -2}, "top_k must be None or an integer from 1 to the vocabulary size 5"),
    ("top_k 2.5", {"top_k": 2.5}, "top_k must be None or an integer"),
    ("NaN logit", {"logits": np.array([0.0, np.nan, 1.0])}, r"logits must be finite or -inf.*nan at index 1"),
    ("+inf logit", {"logits": np.array([0.0, np.inf, 1.0])}, r"logits must be finite or -inf.*inf at index 1"),
    ("all -inf", {"logits": np.full(3, -np.inf)}, r"-inf everywhere"),
    ("2-D logits", {"logits": np.zeros((2, 3))}, r"logits must be one row \(vocab,\).*shape \(2, 3\)"),
    ("no logits", {"logits": np.zeros(0)}, r"logits must be one row"),
]


@pytest.mark.parametrize("case,change,message", BAD_DRAWS, ids=[c[0] for c in BAD_DRAWS])
@pytest.mark.parametrize("at", [0.0, 1.0])
def test_next_token_probabilities_checks_every_argument(case, change, message, at):
    kwargs = {"logits": LOGITS, "temperature": at, **change}
    with pytest.raises(ValueError, match=message):
        next_token_probabilities(kwargs.pop("logits"), kwargs.pop("temperature"), **kwargs)


@pytest.mark.parametrize("case,change,message", BAD_DRAWS, ids=[c[0] for c in BAD_DRAWS])
@pytest.mark.parametrize("at", [0.0, 1.0])
def test_sample_next_checks_every_argument_at_any_temperature(case, change, message, at):
    kwargs = {"logits": LOGITS, "temperature": at, **change}
    with pytest.raises(ValueError, match=message):
        sample_next(kwargs.pop("logits"), kwargs.pop("temperature"), np.random.default_rng(0), **kwargs)


def test_logits_of_strings_or_bools_are_a_type_error():
    for logits in ("abc", np.array([True, False]), np.array(["a", "b"])):
        with pytest.raises(TypeError, match="logits must be"):
            sample_next(logits)


def test_temperature_0_is_the_greedy_one_hot_and_tiny_temperatures_are_its_limit():
    np.testing.assert_array_equal(next_token_probabilities(LOGITS, 0.0), [0, 1, 0, 0, 0])
    for t in (1e-300, np.finfo(np.float64).tiny):             # gaps / t overflow to -inf: no warning, no NaN
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            np.testing.assert_array_equal(next_token_probabilities(LOGITS, t), [0, 1, 0, 0, 0])
    ties = np.array([1.0, 3.0, 3.0, -np.inf])
    np.testing.assert_allclose(next_token_probabilities(ties, 1e-300), [0, 0.5, 0.5, 0])
    np.testing.assert_allclose(next_token_probabilities(np.array([-np.inf, 0.0, 0.0]), 1.0), [0, 0.5, 0.5])
    assert sample_next(np.array([-np.inf, 2.0, 1.0])) == 1


def test_generate_refuses_a_subnormal_temperature():
    model = Transformer.init(lm_config(7, d_model=8, n_heads=2, n_layers=1, n_ctx=8), rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="temperature 1e-320 is too small"):
        generate(model, [1, 2], 3, temperature=1e-320, rng=np.random.default_rng(0))


# --- 7. research tools ------------------------------------------------------------------------------------------

@pytest.fixture
def lm(rng):
    return Transformer.init(lm_config(13, d_model=16, n_heads=4, n_layers=3, n_ctx=12), rng=rng, std=0.4,
                            dtype=np.float64)


@pytest.mark.parametrize("heads", [[-1], [4], [99], [True], [1.0], ["1"], []])
def test_path_patch_receiver_heads_are_indices_of_the_model(lm, rng, heads):
    clean = rng.integers(0, 13, 6)
    corrupt = (clean + 1) % 13
    with pytest.raises(ValueError, match=r"receiver 'blocks\.2\.attn\.hook_q': heads must be integers from 0 to 3"):
        path_patch(lm, clean, corrupt, [(0, 2)], [("blocks.2.attn.hook_q", heads)], answer=3, wrong=5)


@pytest.mark.parametrize("pair", [(0.9, 0), (True, 0), ("0", "1"), (0, np.float64(1.0)), (np.bool_(True), 1)])
def test_ablation_hooks_take_integer_heads_only(lm, pair):
    with pytest.raises(TypeError, match=r"a layer and a head are integers"):
        ablation_hooks(lm, [pair], mode="zero")
    assert set(ablation_hooks(lm, [(np.int64(1), 2)], mode="zero")) == {"blocks.1.attn.hook_z"}


@pytest.mark.parametrize("top", ["0", "-1"])
def test_attribute_top_must_be_positive(cli, top):
    cli.error(["attribute", "--model", "induction", "--clean", "|ab", "--corrupt", "|ba", "--answer", "a",
               "--wrong", "b", "--top", top], "argument --top: expected an integer >= 1")


# --- 9. kernels -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("q_shape,k_shape", [((2, 0, 4), (2, 5, 4)), ((0, 3, 4), (0, 5, 4))])
@pytest.mark.parametrize("is_causal", [False, True])
def test_tiled_attention_with_no_queries_is_empty_as_attention_is(rng, q_shape, k_shape, is_causal):
    q, k = rng.normal(size=q_shape), rng.normal(size=k_shape)
    v = rng.normal(size=(*k_shape[:-1], 3))
    want = attention(q, k, v, is_causal=is_causal)
    got, lse = tiled_attention(q, k, v, is_causal=is_causal, return_lse=True)
    assert got.shape == want.shape == (*q_shape[:-1], 3) and lse.shape == q_shape[:-1]
