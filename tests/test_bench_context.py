"""bench --model smollm2's long-context rows (attnlab.cli.bench_context), on a tiny model: the caches hold the
context asked for, the attention-only step runs the layers' kernels, the table says what it measured. No timing
is asserted (benchmarks only)."""

import numpy as np

from attnlab.cli.bench_context import FilledDecoder, context_rows, context_table, kv_bytes
from attnlab.layer.config import AttentionConfig
from attnlab.layer.positions import RoPE
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, new_caches


def tiny():
    att = AttentionConfig(d_model=24, n_heads=3, n_kv_heads=1, d_head=8, n_ctx=64, positions=RoPE(10000.0))
    cfg = ModelConfig(vocab_size=32, n_layers=2, attention=att, d_mlp=16, activation="silu", mlp="gated",
                      norm=RMSNorm, tied_embeddings=True)
    return Transformer.init(cfg, rng=np.random.default_rng(0))


def test_a_filled_decoder_steps_as_a_prefilled_one_would_at_that_length():
    model = tiny()
    d = FilledDecoder(model, 12, np.random.default_rng(0))
    assert all(c.length == 12 and c.k_max > 0 for c in d.caches)
    first = d.step()
    again = d.step()                                                   # rewound: the same context each time
    np.testing.assert_array_equal(first, again)
    caches = new_caches(model, 13)                                     # the same keys and values by hand
    for mine, theirs in zip(caches, d.caches):
        mine.k[...], mine.v[...], mine.length = theirs.k, theirs.v, 12
        mine.k_max, mine.v_max = theirs.k_max, theirs.v_max
    np.testing.assert_array_equal(forward(model, np.array([12]), caches=caches).logits, first)
    assert kv_bytes(model, 12) == 2 * 2 * 1 * 12 * 8 * 4                   # k and v, 2 layers, 1 head


def test_the_rows_and_their_table():
    model = tiny()
    rows = context_rows(model, model, None, rounds=3, contexts=(8, 32), llama=False)
    assert [r["context"] for r in rows] == [8, 32]
    assert all(r["float32_ms"] >= 0 and r["attention_ms"] >= 0 and r["llama_cpp"] is None for r in rows)
    text = "\n".join(context_table(rows))
    assert "long contexts" in text and "not importable" in text and "per 1,000 tokens" in text


def test_a_float16_cache_fills_and_steps_and_the_q8_row_shows():
    """A filled decoder on float16 caches (what the rule gives the q8 mode) holds the context and steps, at half
    the bytes; the q8 columns appear in the table when a q8 model is given (here the tiny model again)."""
    model = tiny()
    d = FilledDecoder(model, 12, np.random.default_rng(0))
    d.caches = new_caches(model, 13, kv_dtype=np.float16)
    d.fill()
    assert all(c.k.dtype == np.float16 and c.length == 12 and c.k_max > 0 for c in d.caches)
    np.testing.assert_array_equal(d.step(), d.step())
    assert kv_bytes(model, 12, np.float16) * 2 == kv_bytes(model, 12)
    rows = context_rows(model, model, None, rounds=3, contexts=(8, 32), llama=False, q8=model)
    assert all(r["q8"]["ms"] >= 0 and r["q8"]["kv_mb"] > 0 for r in rows)
    assert "q8 (float16 cache)" in "\n".join(context_table(rows))
