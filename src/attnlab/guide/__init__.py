"""The guide, runnable: one module per section, each returning the numbers the guide prints.

========== =========================================================
lookup     the soft lookup and its hard limit
toy        the toy text, the 12 × 4 embeddings, random W_Q, W_K, W_V
explain    the equation symbol by symbol; the shapes table; the mask
scaling    why divide by √d_k
heads      multi-head attention on GPT-2 small's shapes
order      attention is blind to order; position vectors fix it
cost       parameters, scores, FLOPs, memory, KV cache
published  five published models' attention shapes, with sources
========== =========================================================
"""

from .cost import (COST_CONFIGS, GPT2_SMALL_COST, KV_N, LLAMA_3_2_1B_COST, MECHANISMS, Cost, CostConfig, KVCost, cost, growth,
                   kv_bytes_per_token, kv_cache_bytes, kv_cost, kv_numbers_per_layer, kv_table, params, tile_shape, tiled_grid_numbers,
                   undo, without_gqa)
from .published import PUBLISHED, Published
from .explain import SYMBOLS, MaskTable, Step, explain, mask_table, shape_sizes, shapes
from .heads import HeadsRun, run_heads
from ..text.ngrams import Floor, encode, floors, iter_floors, read_utf8   # the library's: section 1, n-gram floors
from .lookup import Lookup, hard_lookup, soft_lookup
from .order import OrderChecks, order_checks
from .scaling import Spread, TopWeight, dot_product_spread, saturation, top_weight
from .toy import (RUNNING_EXAMPLE, TOY_TEXT, GuideToy, SkipGramConfig, ToyEmbeddings, guide_toy,
                  random_projections, self_attention, train_embeddings)

__all__ = [
    "COST_CONFIGS", "GPT2_SMALL_COST", "KV_N", "KVCost", "LLAMA_3_2_1B_COST", "MECHANISMS", "PUBLISHED", "Published", "RUNNING_EXAMPLE", "SYMBOLS", "TOY_TEXT",
    "Cost", "CostConfig", "Floor", "GuideToy", "HeadsRun", "Lookup", "MaskTable", "OrderChecks",
    "SkipGramConfig", "Spread", "Step", "ToyEmbeddings", "TopWeight",
    "cost", "dot_product_spread", "encode", "explain", "floors", "growth", "guide_toy", "hard_lookup",
    "iter_floors", "kv_bytes_per_token", "kv_cache_bytes", "kv_cost", "kv_numbers_per_layer", "kv_table", "mask_table", "order_checks", "params", "random_projections",
    "read_utf8", "run_heads", "saturation", "self_attention", "shape_sizes", "shapes", "soft_lookup",
    "tile_shape", "tiled_grid_numbers", "top_weight", "train_embeddings", "undo", "without_gqa",
]
