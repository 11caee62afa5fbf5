"""What trained heads do: detectors, ablation, activation patching, the logit lens, a corpus scan, and an
induction head grown from scratch.

Everything here runs on the one stack (:mod:`attnlab.stack.transformer`) through its named activations
(:mod:`attnlab.stack.hooks`): no second forward pass.
"""

from .attribution import Agreement, Attribution, attribute, compare, rank_correlation
from .detect import (KINDS, detect_heads, duplicate_token_pattern, induction_pattern, pattern_scores,
                     previous_token_pattern, repeated_random_tokens, score_patterns, top_heads)
from .interventions import Ablation, Lens, Patching, ablate, logit_lens, next_token_loss, patch, unembed

__all__ = [
    "KINDS",
    "Agreement",
    "Attribution",
    "attribute",
    "compare",
    "rank_correlation",
    "Ablation",
    "Lens",
    "Patching",
    "ablate",
    "detect_heads",
    "duplicate_token_pattern",
    "induction_pattern",
    "logit_lens",
    "next_token_loss",
    "patch",
    "pattern_scores",
    "previous_token_pattern",
    "repeated_random_tokens",
    "score_patterns",
    "top_heads",
    "unembed",
]
