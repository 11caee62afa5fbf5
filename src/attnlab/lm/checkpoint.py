"""Checkpoints of attnlab's own LM: the weights in safetensors (never pickle), the config and vocabulary as
JSON beside them.

A checkpoint directory holds

    model.safetensors   every array of :meth:`attnlab.stack.transformer.Transformer.params`, by name; its metadata
                        repeats config.json
    config.json         {"model_type": "attnlab", "model": ModelConfig.to_json(), "vocab": {"level", "symbols"}}

``model_type`` is what makes the folder a model family of its own (:mod:`attnlab.models.own`): ``attnlab
attend TEXT --model DIR`` reads it like a GPT-2 folder. A save writes the whole folder beside it and puts it
in place in one step (:func:`attnlab._io.atomic_folder`), so an interrupted save (Ctrl-C included) leaves the
previous checkpoint whole, every file of it. A checkpoint saved during training records its ``step`` in both
files. Loading checks that the two files agree and, when asked, that the checkpoint was made with the expected
configuration. Checkpoints written before the stack (a flat "model" dict, "layers.{i}.W_Q" tensors) load too.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from .._io import atomic_folder, folder_file
from ..layer.positions import scheme_from_json
from ..stack.transformer import ModelConfig, Transformer
from ..text.tokens import HFTokenizer, Vocab, json_folder_tokenizer
from .model import FAMILY, lm_config

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
STATE = "training.safetensors"          # Adam's state beside a training checkpoint (attnlab.lm.resume)
TOKENIZER = "tokenizer.json"            # a fine-tuned model's own tokenizer (Hugging Face's tokenizers format)
FILES = (CONFIG, WEIGHTS, STATE, TOKENIZER)   # a checkpoint folder's files: a save replaces them as one set


def checkpoint_json(config: ModelConfig, vocab: Vocab, step: int | None = None) -> str:
    """The text of config.json (``step``: the training steps taken, for a checkpoint saved while training)."""
    words = {"tokenizer": TOKENIZER} if isinstance(vocab, HFTokenizer) else \
        {"level": vocab.level, "symbols": list(vocab.symbols)}
    data = {"model_type": FAMILY, "model": config.to_json(), "vocab": words}
    return json.dumps(data if step is None else dict(data, step=step), indent=1, sort_keys=True, ensure_ascii=False)


def save_checkpoint(model: Transformer, vocab: Vocab, directory) -> Path:
    """Write ``model`` and ``vocab`` into ``directory`` (created if missing, replaced as a whole: see
    :func:`attnlab._io.atomic_folder`); returns the directory."""
    with atomic_folder(directory, owned=FILES) as tmp:
        write_checkpoint(model, vocab, tmp)
    return Path(directory)


def write_checkpoint(model: Transformer, vocab: Vocab, folder: Path, step: int | None = None) -> None:
    """config.json and model.safetensors into ``folder`` (a save's temporary folder)."""
    from safetensors.numpy import save_file

    if isinstance(vocab, HFTokenizer):                 # a fine-tuned model: its tokenizer.json beside it
        vocab.tokenizer.save(str(folder / TOKENIZER))
    elif model.config.vocab_size != vocab.size:
        raise ValueError(f"the model has vocab_size {model.config.vocab_size}, the vocabulary {vocab.size} symbols")
    meta = checkpoint_json(model.config, vocab, step)
    (folder / CONFIG).write_text(meta, encoding="utf-8")
    # safetensors writes an array's buffer as it lies: a loaded checkpoint's transposed views (W_Q = q_proj.T)
    # must be laid out in C order first, or they come back scrambled
    save_file({k: np.ascontiguousarray(v) for k, v in model.params().items()}, str(folder / WEIGHTS),
              metadata={"attnlab": meta})


def load_checkpoint(directory, *, config: ModelConfig | None = None,
                    vocab: Vocab | None = None) -> tuple[Transformer, Vocab]:
    """The model and vocabulary saved in ``directory`` (a fine-tuned model's: its tokenizer.json).

    Raises
    ------
    FileNotFoundError
        The directory or one of its two files is missing.
    ValueError
        The files are unreadable or disagree with each other, or ``config`` is given and the checkpoint
        was made with a different one (the message lists the fields that differ), or ``vocab`` is given
        and differs from the checkpoint's.
    """
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    directory = Path(directory)
    for name in (CONFIG, WEIGHTS):
        if not folder_file(directory, name).is_file():
            raise FileNotFoundError(2, f"no checkpoint here ({name} is missing)", str(directory))
    text = (directory / CONFIG).read_text(encoding="utf-8")
    saved, saved_vocab = parse_checkpoint_json(text, directory / CONFIG)
    try:
        with safe_open(str(directory / WEIGHTS), framework="np") as f:
            meta = (f.metadata() or {}).get("attnlab")
        params = load_file(str(directory / WEIGHTS))
    except SafetensorError as e:
        raise ValueError(f"{directory / WEIGHTS} is not a readable safetensors file: {e}") from None
    if meta is None or parse_checkpoint_json(meta, directory / WEIGHTS) != (saved, saved_vocab):
        raise ValueError(f"{directory / WEIGHTS} and {directory / CONFIG} come from different models "
                         "(their configurations disagree); save the checkpoint again")
    if saved_step(meta) != saved_step(text):
        raise ValueError(f"{directory / WEIGHTS} is the model at step {saved_step(meta)}, {directory / CONFIG} "
                         f"says step {saved_step(text)}: the two files come from different saves")
    if config is not None and config != saved:
        raise ValueError(f"the checkpoint in {directory} was made with a different configuration: "
                         f"{config_difference(saved, config)}")
    if saved_vocab is None:                            # a fine-tuned model's tokenizer.json
        saved_vocab = json_folder_tokenizer(directory)
    elif vocab is not None and vocab != saved_vocab:
        raise ValueError(f"the checkpoint in {directory} was made with a different vocabulary: "
                         f"{saved_vocab.size} {saved_vocab.level}s in the checkpoint, {vocab.size} {vocab.level}s "
                         "here, or the same number with different symbols")
    params = {_current_name(k): v for k, v in params.items()}
    try:
        return Transformer.from_params(saved, params), saved_vocab
    except ValueError as e:
        raise ValueError(f"{directory / WEIGHTS}: {e}") from None


def _current_name(name: str) -> str:
    """A tensor name as the stack has it: "layers.0.W_Q" (before the stack) -> "blocks.0.attn.W_Q"."""
    if name.startswith("layers."):
        _, i, field = name.split(".")
        return f"blocks.{i}.attn.{field}"
    return name


def saved_step(text: str) -> int | None:
    """The training step a checkpoint's config.json (or its copy in the weights' metadata) records, or None."""
    step = json.loads(text).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def checkpoint_step(directory) -> int | None:
    """The training step the checkpoint in ``directory`` records in its config.json, or None."""
    return saved_step(folder_file(directory, CONFIG).read_text(encoding="utf-8"))


def parse_checkpoint_json(text: str, where) -> tuple[ModelConfig, Vocab]:
    try:
        data = json.loads(text)
        model = data["model"]
        if "attention" in model:
            config = ModelConfig.from_json(model)
        else:                                   # before the stack: the LM's own flat fields
            old = dict(model)
            old["positions"] = scheme_from_json(old.get("positions", "learned"))
            config = lm_config(old.pop("vocab_size"), **old)
        if data["vocab"].get("tokenizer") == TOKENIZER:
            return config, None                         # the folder's tokenizer.json
        return config, Vocab(tuple(data["vocab"]["symbols"]), data["vocab"]["level"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"{where} is not an attnlab checkpoint config ({type(e).__name__}: {e})") from None


def config_difference(saved: ModelConfig, asked: ModelConfig) -> str:
    """The fields that differ, as "n_layers 2 in the checkpoint, 3 asked; …"."""
    a, b = _flat(saved.to_json()), _flat(asked.to_json())
    return "; ".join(f"{k} {a.get(k)!r} in the checkpoint, {b.get(k)!r} asked"
                     for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k))


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and k != "scaling":
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out
