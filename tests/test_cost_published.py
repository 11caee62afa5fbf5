"""The KV cache of five published models (attnlab.guide.published, attnlab.guide.cost), counted by hand."""

import pytest

from attnlab import guide as g
from attnlab.cli import guide as cg

N = 131_072
# bytes per token and at 128k, worked out by hand from each config.json (see attnlab.guide.published):
HAND = {
    # 2 (K, V) · 12 layers · 12 heads · 64 · 4 bytes (float32)
    "gpt2-small": dict(per_token=2 * 12 * 12 * 64 * 4, at_n=2 * 12 * 12 * 64 * 4 * N, gqa=1, window=1, mla=1),
    # 2 · 32 layers · 8 KV heads · 128 · 2 bytes (bfloat16) = 128 KiB; 16 GiB at 128k
    "llama-3-8b": dict(per_token=131_072, at_n=16 * 2**30, gqa=32 / 8, window=1, mla=1),
    # 2 · 36 · 8 · 128 · 2 = 144 KiB; 18 GiB
    "qwen3-8b": dict(per_token=147_456, at_n=18 * 2**30, gqa=32 / 8, window=1, mla=1),
    # 2 · 62 · 16 · 128 · 2 = 496 KiB while n <= 1024; 10 global layers (i + 1 ≡ 0 mod 6) hold all n,
    # 52 local ones 1024: 8192 B per layer-token · (10 · 131072 + 52 · 1024)
    "gemma-3-27b": dict(per_token=507_904, at_n=8192 * (10 * N + 52 * 1024), gqa=32 / 16,
                        window=62 * N / (10 * N + 52 * 1024), mla=1),
    # (kv_lora_rank 512 + qk_rope_head_dim 64) · 61 layers · 2 bytes; without MLA each of 128 heads caches a
    # key of 128 + 64 and a value of 128: 40960 numbers per layer
    "deepseek-v3": dict(per_token=576 * 61 * 2, at_n=576 * 61 * 2 * N, gqa=1, window=1, mla=40_960 / 576),
}


@pytest.mark.parametrize("name", list(HAND))
def test_each_published_model_by_hand(name):
    c, want = g.kv_cost(name), HAND[name]
    assert (c.per_token, c.at_n, c.n) == (want["per_token"], want["at_n"], N)
    for mechanism in ("gqa", "window", "mla"):
        assert c.saves(mechanism) == pytest.approx(want[mechanism], rel=1e-12), mechanism
    assert c.saves("all") == pytest.approx(want["gqa"] * want["window"] * want["mla"], rel=1e-12)


def test_the_table_holds_the_five_in_order_with_sources():
    assert [c.name for c in g.kv_table()] == list(HAND)
    for m in g.PUBLISHED.values():
        assert m.source.startswith("https://huggingface.co/") and "config.json" in m.source
        assert "num_hidden_layers" in m.fields or "n_layer" in m.fields


def test_a_sliding_window_caps_the_local_layers():
    m = g.PUBLISHED["gemma-3-27b"]
    assert (m.n_global, m.n_local) == (10, 52)
    assert g.kv_cache_bytes(m, 1024) == 507_904 * 1024                  # up to the window every layer grows
    assert g.kv_cache_bytes(m, 1025) - g.kv_cache_bytes(m, 1024) == 10 * 8192   # past it only the global ones
    assert g.kv_cost(m).per_token_past_window == 81_920


def test_bytes_per_number_overrides_the_checkpoint_dtype():
    assert g.kv_cost("gpt2-small", 10, bytes_per_number=2).at_n == 2 * 12 * 12 * 64 * 2 * 10
    with pytest.raises(ValueError, match="model must be one of"):
        g.kv_cost("gpt-5")
    with pytest.raises(ValueError, match="mechanisms must be among"):
        g.undo(g.PUBLISHED["qwen3-8b"], "moe")


def test_cost_config_prints_the_published_report(cli):
    text = cli.text("cost", "--config", "deepseek-v3")
    assert "576 numbers per layer" in text and "71.11x" in text and "kv_lora_rank 512" in text
    d = cli.json("cost", "--config", "gemma-3-27b")
    assert d["kv"]["at_n"] == HAND["gemma-3-27b"]["at_n"] and [r["name"] for r in d["table"]] == list(HAND)
    assert d["table"][1]["saves"]["gqa"] == 4.0


def test_plain_cost_is_unchanged_and_gpt2_by_name_adds_its_row(cli):
    d = cli.json("cost")
    assert "published" not in d and d["bytes_per_number"] == 4 and d["kv_bytes_per_token"] == 73_728
    d = cli.json("cost", "--config", "gpt2-small", "--no-growth")
    assert d["published"]["kv"]["per_token"] == 73_728
    cli.error(["cost", "--config", "gpt-5"], "invalid choice")


def test_the_tour_table_names_every_model():
    text, rows = cg.kv_table_text()
    assert all(name in text for name in HAND) and len(rows) == 5
