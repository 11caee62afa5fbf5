"""What trained heads do: detectors, ablation, activation patching, the logit lens, a corpus scan, and an
induction head grown from scratch; attention sinks and a sink + window cache.

Everything here runs on the one stack (:mod:`attnlab.stack.transformer`) through its named activations
(:mod:`attnlab.stack.hooks`): no second forward pass.
"""

from .attribution import Agreement, Attribution, attribute, compare, rank_correlation
from .circuits import (CircuitTokens, CompositionScores, FactoredMatrix, composition_scores, ov_circuit,
                       qk_circuit, read_circuit)
from .detect import (KINDS, detect_heads, duplicate_token_pattern, induction_pattern, pattern_scores,
                     previous_token_pattern, repeated_random_tokens, score_patterns, top_heads)
from .interventions import Ablation, Lens, ablate, ablation_hooks, logit_lens, next_token_loss, unembed
from .patching import PatchGrid, Patching, PathPatching, logit_diff_metric, patch, path_patch
from .sinks import FirstTokenRemoved, first_token_attention, sink_caches, streaming_loss, without_first_token

__all__ = [
    "CircuitTokens",
    "CompositionScores",
    "FactoredMatrix",
    "KINDS",
    "Agreement",
    "Attribution",
    "attribute",
    "compare",
    "rank_correlation",
    "Ablation",
    "FirstTokenRemoved",
    "Lens",
    "PatchGrid",
    "Patching",
    "PathPatching",
    "ablate",
    "ablation_hooks",
    "composition_scores",
    "detect_heads",
    "duplicate_token_pattern",
    "first_token_attention",
    "induction_pattern",
    "logit_diff_metric",
    "logit_lens",
    "next_token_loss",
    "ov_circuit",
    "patch",
    "path_patch",
    "pattern_scores",
    "previous_token_pattern",
    "qk_circuit",
    "read_circuit",
    "repeated_random_tokens",
    "score_patterns",
    "sink_caches",
    "streaming_loss",
    "top_heads",
    "unembed",
    "without_first_token",
]
