"""The attention shapes of five published models, one row each with its source: the data of the KV-cache table
(:func:`attnlab.guide.cost.kv_table`, ``attnlab cost --config NAME``).

Each row states the fields of the model's ``config.json`` on its Hugging Face page (or the paper) that set the
KV cache, under their own names; nothing here is downloaded or read at run time.

- ``n_layers`` num_hidden_layers (GPT-2: n_layer); ``n_heads`` num_attention_heads (n_head); ``n_kv_heads``
  num_key_value_heads (GPT-2 has none: one per query head); ``d_head`` head_dim (GPT-2: n_embd / n_head;
  Llama-3: hidden_size / num_attention_heads; DeepSeek-V3: v_head_dim, with qk_nope_head_dim the same 128).
- ``window`` sliding_window and ``local_per_global``: Gemma-3's layers repeat 5 sliding-window (local) layers
  then 1 global one (sliding_window_pattern 6: layer i is global when (i + 1) % 6 == 0).
- ``kv_lora_rank`` and ``qk_rope_head_dim``: DeepSeek-V3's multi-head latent attention caches, per token and
  layer, one latent of kv_lora_rank numbers (K and V are decompressed from it) and the RoPE slice of the key,
  qk_rope_head_dim numbers shared by all heads. Its heads' keys are qk_nope_head_dim + qk_rope_head_dim wide.
- ``bytes_per_number`` is the checkpoint's torch_dtype: GPT-2's float32 weights, the others' bfloat16 (the KV
  cache is kept in the model's dtype).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..kernels._checks import as_positive_int


@dataclass(frozen=True)
class Published:
    """One model's attention shapes as its config.json states them (see the module for the field names)."""
    name: str                         # what --config takes
    title: str                        # the model's name as published
    n_layers: int
    n_heads: int
    n_kv_heads: int                   # = n_heads without grouped-query attention
    d_head: int                       # per head: keys and values (MLA: the values; keys add qk_rope_head_dim)
    n_ctx: int                        # max_position_embeddings (n_positions)
    bytes_per_number: int             # torch_dtype: 4 float32, 2 bfloat16
    source: str                       # where the numbers are published
    fields: str                       # the config.json fields and values the row is read from
    window: int | None = None         # sliding_window of the local layers; None = every layer global
    local_per_global: int = 0         # local layers before each global one in the repeating pattern
    kv_lora_rank: int | None = None   # MLA's latent width; None = plain (grouped-query) attention
    qk_rope_head_dim: int = 0         # MLA's shared RoPE slice of the key

    def __post_init__(self):
        for name in ("n_layers", "n_heads", "n_kv_heads", "d_head", "n_ctx", "bytes_per_number"):
            as_positive_int(name, getattr(self, name))
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
        if (self.window is None) != (self.local_per_global == 0):
            raise ValueError(f"window and local_per_global go together, got {self.window} and "
                             f"{self.local_per_global}")

    @property
    def n_global(self) -> int:
        """Layers that see every token: every ``local_per_global + 1``-th (Gemma-3: 10 of 62)."""
        return self.n_layers // (self.local_per_global + 1)

    @property
    def n_local(self) -> int:
        return self.n_layers - self.n_global


PUBLISHED = {m.name: m for m in (
    Published("gpt2-small", "GPT-2 (small, 124M)", n_layers=12, n_heads=12, n_kv_heads=12, d_head=64, n_ctx=1024,
              bytes_per_number=4,
              source="https://huggingface.co/openai-community/gpt2/blob/main/config.json (Radford et al., 2019)",
              fields="n_layer 12, n_head 12, n_embd 768 (d_head 768 / 12 = 64), n_positions 1024; float32"),
    Published("llama-3-8b", "Llama-3-8B", n_layers=32, n_heads=32, n_kv_heads=8, d_head=128, n_ctx=8192,
              bytes_per_number=2,
              source="https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json",
              fields="num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8, hidden_size 4096 "
                     "(head_dim 4096 / 32 = 128), max_position_embeddings 8192, torch_dtype bfloat16"),
    Published("qwen3-8b", "Qwen3-8B", n_layers=36, n_heads=32, n_kv_heads=8, d_head=128, n_ctx=40960,
              bytes_per_number=2,
              source="https://huggingface.co/Qwen/Qwen3-8B/blob/main/config.json",
              fields="num_hidden_layers 36, num_attention_heads 32, num_key_value_heads 8, head_dim 128, "
                     "max_position_embeddings 40960 (131,072 with YaRN, its model card), use_sliding_window "
                     "false, torch_dtype bfloat16"),
    Published("gemma-3-27b", "Gemma-3-27B", n_layers=62, n_heads=32, n_kv_heads=16, d_head=128, n_ctx=131072,
              bytes_per_number=2, window=1024, local_per_global=5,
              source="https://huggingface.co/google/gemma-3-27b-it/blob/main/config.json (text_config); Gemma 3 "
                     "Technical Report, 2025",
              fields="num_hidden_layers 62, num_attention_heads 32, num_key_value_heads 16, head_dim 128, "
                     "sliding_window 1024, sliding_window_pattern 6 (5 local : 1 global), "
                     "max_position_embeddings 131072, torch_dtype bfloat16"),
    Published("deepseek-v3", "DeepSeek-V3 (671B)", n_layers=61, n_heads=128, n_kv_heads=128, d_head=128,
              n_ctx=163840, bytes_per_number=2, kv_lora_rank=512, qk_rope_head_dim=64,
              source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json; DeepSeek-V3 "
                     "Technical Report, 2024 (MLA: DeepSeek-V2, 2024)",
              fields="num_hidden_layers 61, num_attention_heads 128, num_key_value_heads 128, kv_lora_rank 512, "
                     "qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128, max_position_embeddings "
                     "163840, torch_dtype bfloat16"),
)}
