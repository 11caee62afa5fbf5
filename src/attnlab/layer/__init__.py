"""One attention layer: its config, position schemes, the KV cache and multi-head attention."""
