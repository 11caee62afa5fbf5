"""What grouped-query attention changes in what attnlab shows: the KV cache in `attnlab cost`, and which
KV head each query head reads in `attnlab attend` (terminal, --summary, --json, --png, --html; on a Llama folder in
test_llama_checkpoint.py)."""

import json

import numpy as np
import pytest

from attnlab import AttentionMap
from attnlab.cli import main
from attnlab.guide.cost import LLAMA_3_2_1B_COST, cost, kv_bytes_per_token, params, without_gqa
from attnlab.viz import terminal_text
from attnlab.viz.html import view_data

KIB, GIB = 1 << 10, 1 << 30


def test_llama_3_2_1b_kv_cache_by_hand():
    """2 (K and V) · 16 layers · 8 KV heads · 64 · 4 bytes = 64 KiB per token; 32 heads without GQA: 256 KiB;
    at n_ctx = 131,072 tokens 8 GiB and 32 GiB."""
    c = LLAMA_3_2_1B_COST
    assert kv_bytes_per_token(c) == 2 * 16 * 8 * 64 * 4 == 64 * KIB
    assert kv_bytes_per_token(without_gqa(c)) == 256 * KIB
    at_ctx = cost(131072, c)
    assert (at_ctx.kv_cache_bytes, at_ctx.kv_cache_bytes_without_gqa) == (8 * GIB, 32 * GIB)
    # W_Q and W_O of 2048 x 2048, W_K and W_V of 2048 x 512; no position table (RoPE)
    p = params(c)
    assert (p.per_layer, p.position_table) == (2 * 2048 * 2048 + 2 * 2048 * 512, 0)
    assert cost(10, c).flops_projections == 2 * 10 * 2048 * 64 * (2 * 32 + 2 * 8)


def test_cost_cli_prints_the_cache_beside_the_model_without_gqa(capsys):
    assert main(["cost", "--config", "llama-3.2-1b", "--no-growth"]) == 0
    out = capsys.readouterr().out
    assert "64.0 KiB vs 256.0 KiB per token, 8.0 GiB vs 32.0 GiB at n_ctx = 131,072" in out
    assert main(["cost", "--config", "llama-3.2-1b", "--no-growth", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert (d["kv_bytes_per_token"], d["kv_bytes_per_token_without_gqa"]) == (65536, 262144)
    assert (d["n_heads"], d["n_kv_heads"]) == (32, 8)
    assert main(["cost", "--no-growth"]) == 0                       # GPT-2 small has no GQA line
    assert "Grouped-query" not in capsys.readouterr().out


@pytest.fixture
def grouped(rng):
    w = rng.random((2, 6, 3, 3))
    return AttentionMap(("a", "b", "c"), w / w.sum(-1, keepdims=True), n_kv_heads=2, source="toy")


def test_each_query_head_names_its_kv_head(grouped):
    assert [grouped.kv_head(h) for h in range(6)] == [0, 0, 0, 1, 1, 1]
    assert grouped.kv_note(4) == "reads KV head 1 with heads 3-5"
    assert "layer 1, head 4 (reads KV head 1 with heads 3-5)" in terminal_text(grouped, 1, 4)
    assert view_data(grouped)["kv_heads"] == [0, 0, 0, 1, 1, 1]
    plain = AttentionMap(("a",), np.ones((1, 2, 1, 1)))
    assert not plain.grouped and plain.kv_note(1) == "" and view_data(plain)["kv_heads"] is None
    with pytest.raises(ValueError, match="n_kv_heads must be a positive integer dividing the 6 heads, got 4"):
        AttentionMap(("a", "b", "c"), grouped.weights, n_kv_heads=4)
