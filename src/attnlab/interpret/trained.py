"""The small induction model shipped with attnlab, so that the tests and the tour need not train one.

It was trained with the defaults of ``attnlab train --task induction`` (:data:`INDUCTION_CONFIG`)::

    attnlab train --task induction --out DIR        # seed 0, 1000 steps; then copy config.json and
                                                    # model.safetensors of DIR into attnlab/models/data/induction

A 2-layer, 2-head attention-only model with RoPE on 32 random tokens and a BOS ("|"): about 150 KB. It is a
shipped model of :mod:`attnlab.models.registry`, so ``load_model("induction")`` and ``--model induction`` take it.
"""

from __future__ import annotations

from pathlib import Path

from ..models.registry import induction_path
from .induction import InductionConfig

INDUCTION_CONFIG = InductionConfig()
INDUCTION_COMMAND = "attnlab train --task induction --out DIR"


def induction_checkpoint() -> Path:
    """The folder of the shipped checkpoint (config.json, model.safetensors)."""
    return induction_path()


def load_induction_model():
    """The shipped induction model, a :class:`attnlab.stack.transformer.Transformer`."""
    from ..lm.checkpoint import load_checkpoint
    return load_checkpoint(induction_checkpoint(), config=INDUCTION_CONFIG.model_config(),
                           vocab=INDUCTION_CONFIG.task.vocab())[0]
