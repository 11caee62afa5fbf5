"""The small induction model shipped with attnlab, so that the tests and the tour need not train one.

It was trained with the defaults of ``attnlab train --task induction`` (:data:`INDUCTION_CONFIG`)::

    attnlab train --task induction --out DIR        # seed 0, 1000 steps; then copy config.json and
                                                    # model.safetensors of DIR into attnlab/interpret/data/induction

A 2-layer, 2-head attention-only model with RoPE on 32 random tokens and a BOS ("|"): about 150 KB.
"""

from __future__ import annotations

from pathlib import Path

from .induction import InductionConfig

INDUCTION_CONFIG = InductionConfig()
INDUCTION_COMMAND = "attnlab train --task induction --out DIR"


INDUCTION = "induction"      # the name the interpret commands accept for it, beside "minilm"


def resolve(model):
    """``"induction"`` -> the shipped checkpoint's folder; anything else unchanged (for load_model)."""
    return induction_checkpoint() if isinstance(model, str) and model == INDUCTION else model


def induction_checkpoint() -> Path:
    """The folder of the shipped checkpoint (config.json, model.safetensors)."""
    return Path(__file__).with_name("data") / "induction"


def load_induction_model():
    """The shipped induction model, a :class:`attnlab.stack.transformer.Transformer`."""
    from ..lm.checkpoint import load_checkpoint
    return load_checkpoint(induction_checkpoint(), config=INDUCTION_CONFIG.model_config(),
                           vocab=INDUCTION_CONFIG.task.vocab())[0]
