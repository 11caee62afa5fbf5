"""An induction head grown from scratch (Olsson et al., 2022; Elhage et al., 2021).

attnlab's own attention-only LM is trained on sequences of random tokens in which a segment repeats::

    r = s distinct random tokens, s drawn per sequence from [min_period, max_period]
    sequence = BOS r r r …  (cut to n_ctx + 1 tokens; inputs are the first n_ctx, targets the last n_ctx)

(``tiled=False`` gives pairs of fresh segments instead, r r q q ….) On the first copy of r nothing predicts
the next token: the best loss there is about log V. From the second copy on, the next token is the one that
followed the current token last time: an induction head in layer 1 finds it by attending to "the token after
an earlier copy of me", which needs a previous-token head in layer 0 to have written each token's predecessor
into its residual stream (K-composition). One layer has no head that knows what came before a key.

Choices, and why:

- The period is drawn per sequence. With a fixed period one layer could copy the token exactly s − 1
  positions back: a positional shortcut that imitates induction without it. A range of periods leaves one
  layer only a guess among the tokens min_period − 1 … max_period − 1 back (:func:`offset_baseline`).
- RoPE positions. With learned absolute positions the same runs formed weaker previous-token heads; with
  pairs of segments (r r q q) the 2-layer model solved the task with a duplicate-token head in layer 0
  instead. Tiled segments with RoPE form the textbook pair: a previous-token head, then an induction head.
- A BOS token (id V, shown "|") opens every sequence, as TransformerLens prepends one: a head with nothing
  to do rests its weight there, and the detectors score with ``exclude_bos``.

Targets are labelled by :func:`target_kinds`: ``REPEAT`` where the current token occurred before and was then
followed by the target (what induction predicts), ``FIRST`` where the target never occurred before, ``OTHER``
otherwise (the first token of the second copy, whose current token has no earlier occurrence).
"""

from __future__ import annotations

import string
import time
from dataclasses import dataclass, field

import numpy as np

from ..kernels._checks import as_positive_int, check_rng
from ..lm.model import lm_config
from ..lm.training import AdamConfig, AdamState, cosine_decay, steps_on
from ..layer.positions import POSITION_SCHEMES
from ..stack.transformer import Transformer, forward
from ..text.tokens import Vocab
from .detect import detect_heads
from .interventions import per_token_loss

FIRST, REPEAT, OTHER = 0, 1, -1
SYMBOLS = string.ascii_lowercase + string.digits     # the task's tokens shown as letters, then digits
BOS = "|"


@dataclass(frozen=True)
class InductionTask:
    """The data: V random-token ids (and BOS), windows of n_ctx, a period drawn per sequence."""
    vocab_size: int = 32        # random tokens: log V = 3.47 nats on first occurrences; 26 letters + 6 digits
    n_ctx: int = 24             # tokens per window: at least two copies of the longest segment
    min_period: int = 4         # the segment length s, drawn per sequence: no fixed offset to copy from
    max_period: int = 8
    tiled: bool = True          # one segment repeated to the end (r r r …), or pairs (r r q q …)

    def __post_init__(self):
        for name in ("vocab_size", "n_ctx", "min_period", "max_period"):
            as_positive_int(name, getattr(self, name))
        if not 2 <= self.min_period <= self.max_period:
            raise ValueError(f"need 2 <= min_period <= max_period <= vocab_size, got {self.min_period}, "
                             f"{self.max_period}, {self.vocab_size}")
        if self.n_ctx < 2 * self.max_period + 1:
            raise ValueError(f"n_ctx must hold BOS and two copies of the longest segment "
                             f"(>= {2 * self.max_period + 1}), "
                             f"got {self.n_ctx}")
        if self.max_period > self.vocab_size:
            raise ValueError(f"a segment of max_period {self.max_period} distinct tokens needs vocab_size >= "
                             f"{self.max_period}, got {self.vocab_size}")
        if self.vocab_size > len(SYMBOLS):
            raise ValueError(f"vocab_size must be at most {len(SYMBOLS)} (one letter or digit per token), "
                             f"got {self.vocab_size}")

    @property
    def bos(self) -> int:
        return self.vocab_size

    def vocab(self) -> Vocab:
        """The checkpoint's vocabulary: V letters and digits, then BOS."""
        return Vocab((*SYMBOLS[:self.vocab_size], BOS), "char")


def induction_batch(task: InductionTask, batch_size: int, rng: np.random.Generator):
    """``batch_size`` sequences: ids (B, n_ctx), targets (B, n_ctx), and each target's kind (B, n_ctx)
    (FIRST, REPEAT or OTHER)."""
    rng = check_rng(rng)
    n = task.n_ctx
    seqs = np.full((batch_size, n + 1), task.bos, np.int64)                              # (B, n + 1)
    for row in seqs:
        tokens = iter(rng.permutation(task.vocab_size))                                   # never the same twice
        at = 1
        while at <= n:
            r = [next(tokens) for _ in range(rng.integers(task.min_period, task.max_period + 1))]
            pair = (r * (n if task.tiled else 2))[:n + 1 - at]                           # r r …, cut at the end
            row[at:at + len(pair)] = pair
            at += len(pair)
    return seqs[:, :-1], seqs[:, 1:], target_kinds(seqs)


def target_kinds(seqs: np.ndarray) -> np.ndarray:
    """Each target's kind (B, n) for sequences (B, n + 1): REPEAT where the current token occurred before and
    was then followed by the target (what an induction head predicts), FIRST where the target never occurred
    before, OTHER for the rest."""
    B, n1 = seqs.shape
    kind = np.full((B, n1 - 1), OTHER)                                                   # (B, n)
    for b, row in enumerate(seqs):
        for t in range(n1 - 1):
            earlier = np.flatnonzero(row[:t] == row[t])                                  # occurrences before t
            if (row[earlier + 1] == row[t + 1]).any():
                kind[b, t] = REPEAT
            elif not (row[:t + 1] == row[t + 1]).any():
                kind[b, t] = FIRST
    return kind


@dataclass(frozen=True, eq=False)
class Evaluation:
    """Loss on first occurrences and on repeats, and the detectors' scores, at one step."""
    step: int
    first_loss: float
    repeat_loss: float
    previous_token: np.ndarray      # (n_layers, n_heads)
    induction: np.ndarray           # (n_layers, n_heads)
    duplicate_token: np.ndarray     # (n_layers, n_heads)


def first_and_repeat_loss(model: Transformer, batch) -> tuple[float, float]:
    """The mean loss on FIRST and on REPEAT targets of ``batch`` (ids, targets, kinds), nats."""
    ids, targets, kind = batch
    loss = per_token_loss(forward(model, ids).logits, targets)           # (B, n)
    return float(loss[kind == FIRST].mean()), float(loss[kind == REPEAT].mean())


def off_range_batch(task: InductionTask, batch_size: int, rng: np.random.Generator):
    """The standard induction test with a period the training never drew: BOS, then N random distinct tokens
    twice, N = (n_ctx − 1) // 2 > max_period. Induction, which matches content, carries over; a guess by
    offset, tuned to the trained periods, does not. Returns (ids, targets, kinds), each (B, 2N)."""
    rng = check_rng(rng)
    n = (task.n_ctx - 1) // 2
    if n <= task.max_period:
        raise ValueError(f"n_ctx {task.n_ctx} leaves no room for a period beyond max_period {task.max_period}")
    seqs = np.array([np.concatenate([[task.bos], r, r]) for r in
                     (rng.permutation(task.vocab_size)[:n] for _ in range(batch_size))])   # (B, 2N + 1)
    return seqs[:, :-1], seqs[:, 1:], target_kinds(seqs)


def evaluate(model: Transformer, batch, step: int) -> Evaluation:
    """``batch`` from :func:`induction_batch`: the mean loss on FIRST and on REPEAT targets, and the detector
    scores averaged over the batch's sequences."""
    ids = batch[0]
    first, repeat = first_and_repeat_loss(model, batch)
    s = detect_heads(model, ids, exclude_bos=True)
    return Evaluation(step=step, first_loss=first, repeat_loss=repeat, previous_token=s["previous_token"],
                      induction=s["induction"], duplicate_token=s["duplicate_token"])


@dataclass(frozen=True)
class InductionConfig:
    """One training run. The defaults take about ten seconds on one core and form both heads."""
    task: InductionTask = InductionTask()
    n_layers: int = 2           # 2 grows an induction head; 1 is the control that cannot
    n_heads: int = 2            # per layer: room for a previous-token head beside another
    d_model: int = 64
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-2            # Adam's peak rate, decayed along a cosine to 0.1× (a constant rate leaves the
                                # repeat loss jumping between 0.002 and 0.1 near the end)
    positions: str = "rope"     # relative positions: see the module's note on the shortcut learned ones allow
    eval_every: int = 10
    eval_size: int = 64         # held-out sequences, drawn once from their own seed
    seed: int = 0

    def __post_init__(self):
        for name in ("n_layers", "n_heads", "d_model", "steps", "batch_size", "eval_every", "eval_size"):
            as_positive_int(name, getattr(self, name))
        if self.positions not in POSITION_SCHEMES:
            raise ValueError(f"positions must be one of {sorted(POSITION_SCHEMES)}, got {self.positions!r}")
        if not isinstance(self.task, InductionTask):
            raise TypeError(f"task must be an InductionTask, got {type(self.task).__name__}")

    def model_config(self):
        return lm_config(self.task.vocab_size + 1, d_model=self.d_model, n_heads=self.n_heads, n_layers=self.n_layers,
                         n_ctx=self.task.n_ctx, positions=POSITION_SCHEMES[self.positions]())


@dataclass(eq=False)
class InductionRun:
    """A run's model, its curve (one :class:`Evaluation` per ``eval_every`` steps) and where it stands."""
    config: InductionConfig
    model: Transformer
    rng: np.random.Generator          # the training batches' generator, for a resume
    adam: AdamState
    history: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def step(self) -> int:
        return self.adam.t

    @property
    def final(self) -> Evaluation:
        return self.history[-1]

    def phase_change_step(self) -> int | None:
        """The step where the repeat loss falls: the first evaluation below half of what one layer reaches
        without induction (:func:`offset_baseline`); None if it never gets there (the one-layer control)."""
        half = 0.5 * offset_baseline(eval_batch(self.config), self.config.task)
        return next((e.step for e in self.history if e.repeat_loss < half), None)


def start_run(config: InductionConfig) -> InductionRun:
    """A fresh model and generator from ``config.seed``, and its step-0 evaluation."""
    rng = np.random.default_rng(config.seed)
    model = Transformer.init(config.model_config(), rng=rng)
    run = InductionRun(config=config, model=model, rng=rng, adam=AdamState.zeros(model.params()))
    run.history.append(evaluate(model, eval_batch(config), 0))
    return run


def eval_batch(config: InductionConfig):
    """The held-out sequences every evaluation uses: the same for every run of the task."""
    return induction_batch(config.task, config.eval_size, np.random.default_rng([config.seed, 1]))


def train_steps(run: InductionRun, *, until: int | None = None):
    """Train ``run`` in place up to step ``until`` (default: the config's steps), yielding the step number
    after each update; evaluations are appended to ``run.history`` every ``eval_every`` steps."""
    c = run.config
    until = c.steps if until is None else until
    held_out = eval_batch(c)
    t0 = time.perf_counter()
    steps = steps_on(run.model, lambda r: induction_batch(c.task, c.batch_size, r)[:2], steps=until, rng=run.rng,
                     adam=AdamConfig(lr=c.lr), schedule=cosine_decay(c.steps), state=run.adam, start=run.adam.t)
    for s in steps:
        if s.step % c.eval_every == 0 or s.step == c.steps:
            run.history.append(evaluate(run.model, held_out, s.step))
        run.seconds += time.perf_counter() - t0
        t0 = time.perf_counter()
        yield s.step


def train_induction(config: InductionConfig = InductionConfig()) -> InductionRun:
    """Train from scratch to ``config.steps``; the finished :class:`InductionRun`."""
    run = start_run(config)
    for _ in train_steps(run):
        pass
    return run


def evaluation_json(e: Evaluation) -> dict:
    return {"step": e.step, "first_loss": e.first_loss, "repeat_loss": e.repeat_loss,
            "previous_token": e.previous_token.tolist(), "induction": e.induction.tolist(),
            "duplicate_token": e.duplicate_token.tolist()}


def evaluation_from_json(d: dict) -> Evaluation:
    return Evaluation(step=int(d["step"]), first_loss=float(d["first_loss"]), repeat_loss=float(d["repeat_loss"]),
                      **{k: np.array(d[k]) for k in ("previous_token", "induction", "duplicate_token")})


def config_json(c: InductionConfig) -> dict:
    from dataclasses import asdict
    return asdict(c)


def save_run(run: InductionRun, directory) -> None:
    """The model as an attnlab checkpoint (``attnlab detect/attend --model DIR`` read it) and, beside it, Adam's
    state, the generator and the curve so far, so that :func:`load_run` resumes exactly."""
    from ..lm.resume import save_training_run
    save_training_run(directory, run.model, run.config.task.vocab(), run.adam, run.rng,
                      {"task": "induction", "config": config_json(run.config), "seconds": run.seconds,
                       "history": [evaluation_json(e) for e in run.history]})


def load_run(config: InductionConfig, directory) -> InductionRun:
    """The run saved in ``directory`` by :func:`save_run`, checked against ``config``, ``steps`` included: the
    cosine schedule is laid out over them, so a run resumed to another total could not end where an
    uninterrupted one ends."""
    from ..lm.resume import load_training_run
    model, _, adam, rng, extra = load_training_run(directory, config=config.model_config(),
                                                   vocab=config.task.vocab())
    saved, mine = extra.get("config", {}), config_json(config)
    if extra.get("task") == "induction" and saved.get("steps") != mine["steps"]:
        raise ValueError(f"the run in {directory} follows a cosine schedule laid out over --steps "
                         f"{saved.get('steps')}; --steps {mine['steps']} would change the rate of every step. "
                         f"Resume it with --steps {saved.get('steps')}")
    if extra.get("task") != "induction" or saved != mine:
        differ = sorted(k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k))
        raise ValueError(f"the run in {directory} was trained with other settings ({', '.join(differ) or 'task'}); "
                         "resume it with the same ones")
    return InductionRun(config=config, model=model, rng=rng, adam=adam, seconds=float(extra.get("seconds", 0.0)),
                        history=[evaluation_from_json(d) for d in extra.get("history", [])])


def best_heads(e: Evaluation) -> dict:
    """The layer-0 head with the highest previous-token score and the last layer's best induction head."""
    h0 = int(np.argmax(e.previous_token[0]))
    last = e.induction.shape[0] - 1
    h1 = int(np.argmax(e.induction[last]))
    return {"previous_token": (0, h0, float(e.previous_token[0, h0])),
            "induction": (last, h1, float(e.induction[last, h1]))}


def offset_baseline(batch, task: InductionTask) -> float:
    """The loss on REPEAT targets of a predictor that knows only the range of periods: uniform over the distinct
    tokens min_period − 1 … max_period − 1 positions back (the target is the token s − 1 back), other than the
    current one. A single layer with relative positions (RoPE) can reach this without any induction."""
    ids, targets, kind = batch
    out = []
    for row, tgt, k in zip(ids, targets, kind):
        for t in np.flatnonzero(k == REPEAT):
            back = row[max(1, t - task.max_period + 1):t - task.min_period + 2]
            seen = set(back.tolist()) - {int(row[t])}
            out.append(np.log(len(seen)) if int(tgt[t]) in seen else np.inf)
    return float(np.mean(out))


def copy_baseline(batch) -> float:
    """The loss on REPEAT targets of a predictor that only knows which tokens the context holds: uniform over
    the distinct earlier tokens other than the current one (r's tokens are distinct, so the next one is never
    the current one). What a single layer can reach by copying from its context, without induction."""
    ids, targets, kind = batch
    out = []
    for row, tgt, k in zip(ids, targets, kind):
        for t in np.flatnonzero(k == REPEAT):
            seen = set(row[1:t + 1].tolist()) - {int(row[t])}                      # after BOS
            out.append(np.log(len(seen)) if int(tgt[t]) in seen else np.inf)
    return float(np.mean(out))
