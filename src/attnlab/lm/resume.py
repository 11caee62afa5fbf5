"""Training that resumes exactly: Adam's moments, its step count and the generator's state, saved beside a
checkpoint.

``training.safetensors`` holds ``m.<name>`` and ``v.<name>`` for every parameter; its metadata holds the
step count, the random generator's full state (``numpy.random.Generator.bit_generator.state``, plain JSON)
and whatever the caller adds (e.g. a run's curve so far). A run stopped after step k and resumed from
these (with the checkpoint's weights) draws the same batches and takes the same steps as a run that never
stopped: it ends bit for bit where that one ends.

:func:`save_training_run` writes the checkpoint and this state as one set (:func:`attnlab._io.atomic_folder`):
a kill at any point of a save leaves the previous step's three files, or the new step's, never a mix; and
:func:`load_training_run` checks that config.json, model.safetensors and training.safetensors agree on the step.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._io import atomic_folder, atomic_path, folder_file
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import Vocab
from .checkpoint import FILES, STATE, checkpoint_step, load_checkpoint, write_checkpoint
from .training import AdamState


def save_training_run(directory, model: Transformer, vocab: Vocab, state: AdamState, rng: np.random.Generator,
                      extra: dict | None = None) -> Path:
    """The checkpoint of ``model`` at step ``state.t`` and its training state, written as one set into
    ``directory`` (replaced as a whole, in one step); returns the directory."""
    with atomic_folder(directory, owned=FILES) as tmp:
        write_checkpoint(model, vocab, tmp, step=state.t)
        write_training_state(tmp / STATE, state, rng, extra)
    return Path(directory)


def load_training_run(directory, *, config: ModelConfig | None = None, vocab: Vocab | None = None):
    """``(model, vocab, state, rng, extra)`` saved by :func:`save_training_run`, once config.json,
    model.safetensors and training.safetensors are checked to be at one step.

    Raises
    ------
    ValueError
        What :func:`load_checkpoint` and :func:`load_training_state` raise, or files of different steps (or a
        checkpoint that records no step, so its files cannot be matched).
    """
    model, saved_vocab = load_checkpoint(directory, config=config, vocab=vocab)
    state, rng, extra = load_training_state(directory, model.params())
    step = checkpoint_step(directory)
    if step is None:
        raise ValueError(f"{Path(directory) / 'config.json'} records no training step, so its weights cannot be "
                         f"matched with {STATE} (a checkpoint saved before saves were one set); start a new run")
    if step != state.t:
        raise ValueError(f"{directory} is not one checkpoint: model.safetensors and config.json are at step {step}, "
                         f"{STATE} at step {state.t}; start a new run, or resume from a whole checkpoint")
    return model, saved_vocab, state, rng, extra


def save_training_state(directory, state: AdamState, rng: np.random.Generator, extra: dict | None = None) -> Path:
    """Write Adam's ``state`` and ``rng``'s state (and ``extra``, JSON) into ``directory``/training.safetensors
    (that one file, atomically; :func:`save_training_run` writes it with its checkpoint as one set)."""
    path = Path(directory) / STATE
    with atomic_path(path) as tmp:
        write_training_state(tmp, state, rng, extra)
    return path


def write_training_state(path: Path, state: AdamState, rng: np.random.Generator, extra: dict | None) -> None:
    from safetensors.numpy import save_file

    if not isinstance(state, AdamState):
        raise TypeError(f"state must be an AdamState, got {type(state).__name__}")
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")
    tensors = {f"m.{k}": np.ascontiguousarray(a) for k, a in state.m.items()} | \
        {f"v.{k}": np.ascontiguousarray(a) for k, a in state.v.items()}   # save_file writes a buffer as it lies
    meta = {"step": state.t, "rng": rng.bit_generator.state, "extra": extra or {}}
    save_file(tensors, str(path), metadata={"attnlab_training": json.dumps(meta)})


def load_training_state(directory, params: dict) -> tuple[AdamState, np.random.Generator, dict]:
    """Adam's state for ``params`` (names and shapes checked), the generator as it was, and the extra JSON.

    Raises
    ------
    FileNotFoundError
        No training.safetensors in ``directory`` (a checkpoint saved without its training state).
    ValueError
        An unreadable file, or moments that do not fit ``params``.
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    path = folder_file(directory, STATE)
    if not path.is_file():
        raise FileNotFoundError(2, "no training state to resume from (training.safetensors is missing; it is "
                                   "written with the checkpoint since resuming became exact)", str(path))
    try:
        with safe_open(str(path), framework="np") as f:
            meta = json.loads((f.metadata() or {})["attnlab_training"])
        tensors = load_file(str(path))
        step, rng_state, extra = int(meta["step"]), meta["rng"], meta.get("extra", {})
        bit_generator = getattr(np.random, rng_state["bit_generator"])()
        bit_generator.state = rng_state
    except (SafetensorError, KeyError, TypeError, ValueError, AttributeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a readable attnlab training state ({type(e).__name__}: {e})") from None
    m, v = {}, {}
    for name, p in params.items():
        for store, prefix in ((m, "m."), (v, "v.")):
            a = tensors.get(prefix + name)
            if a is None or a.shape != p.shape or a.dtype != p.dtype:
                got = None if a is None else f"{a.dtype} {a.shape}"
                raise ValueError(f"{path}: {prefix}{name} is {got}, the model's parameter is {p.dtype} {p.shape}")
            store[name] = a
    extra_names = set(tensors) - {f"{x}.{k}" for x in "mv" for k in params}
    if extra_names:
        raise ValueError(f"{path} holds moments of parameters the model does not have: {sorted(extra_names)[:3]}")
    return AdamState(m=m, v=v, t=step), np.random.Generator(bit_generator), extra
