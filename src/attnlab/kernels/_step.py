"""One step of a model: the scope in which each kernel choice is made once.

A decode step asks the same questions in every layer: which attention path and kernel (a rule on the shapes,
the environment's ``ATTNLAB_KERNEL``/``ATTNLAB_NO_NUMBA`` and the tune profile), which quantized kernel and on
how many threads. Inside :func:`one_step` (a model's forward pass opens one around its layers) the first
asker computes the answer by the same rule and later askers of the same question take it: the environment is
read once per step, not in every layer, and a change of it between steps still counts. Outside a step every
call decides for itself, as before. The answers are the rule's, so no result changes.

A step may also say how many attention scores its whole pass computes (every layer's batch · heads · n_q ·
n_k): the fused kernels' size rule counts those in place of one call's (numba loads once for every layer of
the pass; :func:`attnlab.kernels._kernels.tile_kernel_rule`). A shape, so still a rule, never a time.
"""

from __future__ import annotations

import contextlib
import contextvars

# the answers given so far in this step, by question; None outside a step
_ANSWERS: contextvars.ContextVar = contextvars.ContextVar("attnlab_step_answers", default=None)
PASS_SCORES = "pass scores"        # the answers' key of the step's attention scores, all layers together


@contextlib.contextmanager
def one_step(scores: int = 0):
    """The scope of one step: each question answered once inside it. Nested scopes share the outer one's.
    ``scores``: the attention scores of the step's whole pass (0: unknown; each call then counts its own)."""
    if _ANSWERS.get() is not None:
        yield
        return
    token = _ANSWERS.set({PASS_SCORES: int(scores)})
    try:
        yield
    finally:
        _ANSWERS.reset(token)


def answers() -> dict | None:
    """This step's answers by question (a dict to read and fill), or None outside a step."""
    return _ANSWERS.get()


def pass_scores() -> int:
    """The attention scores of this step's whole pass, as :func:`one_step` was told them; 0 outside a step."""
    step = _ANSWERS.get()
    return 0 if step is None else step.get(PASS_SCORES, 0)
