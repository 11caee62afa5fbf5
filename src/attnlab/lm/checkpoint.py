"""Checkpoints: the weights in safetensors (never pickle), the config and vocabulary as JSON beside them.

A checkpoint directory holds

    model.safetensors   every array of :meth:`AttentionLM.params`, by name; its metadata repeats config.json
    config.json         {"model": LMConfig fields, "vocab": {"level": ..., "symbols": [...]}}

Each file is written through :func:`attnlab._io.atomic_path`, so an interrupted save (Ctrl-C included)
leaves the previous file whole. Loading checks that the two files agree and, when asked, that the
checkpoint was made with the expected configuration.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from pathlib import Path

from .._io import atomic_path
from .model import AttentionLM, LMConfig
from .text import Vocab

WEIGHTS = "model.safetensors"
CONFIG = "config.json"


def checkpoint_json(config: LMConfig, vocab: Vocab) -> str:
    """The text of config.json."""
    return json.dumps({"model": asdict(config), "vocab": {"level": vocab.level, "symbols": list(vocab.symbols)}},
                      indent=1, sort_keys=True, ensure_ascii=False)


def save_checkpoint(model: AttentionLM, vocab: Vocab, directory) -> Path:
    """Write ``model`` and ``vocab`` into ``directory`` (created if missing); returns the directory."""
    from safetensors.numpy import save_file

    if model.config.vocab_size != vocab.size:
        raise ValueError(f"the model has vocab_size {model.config.vocab_size}, the vocabulary {vocab.size} symbols")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    meta = checkpoint_json(model.config, vocab)
    with atomic_path(directory / CONFIG) as tmp:
        tmp.write_text(meta, encoding="utf-8")
    with atomic_path(directory / WEIGHTS) as tmp:
        save_file(model.params(), str(tmp), metadata={"attnlab": meta})
    return directory


def load_checkpoint(directory, *, config: LMConfig | None = None,
                    vocab: Vocab | None = None) -> tuple[AttentionLM, Vocab]:
    """The model and vocabulary saved in ``directory``.

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
        if not (directory / name).is_file():
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
    if config is not None and config != saved:
        raise ValueError(f"the checkpoint in {directory} was made with a different configuration: "
                         f"{config_difference(saved, config)}")
    if vocab is not None and vocab != saved_vocab:
        raise ValueError(f"the checkpoint in {directory} was made with a different vocabulary: "
                         f"{saved_vocab.size} {saved_vocab.level}s in the checkpoint, {vocab.size} {vocab.level}s "
                         "here, or the same number with different symbols")
    return AttentionLM.from_params(saved, params), saved_vocab


def parse_checkpoint_json(text: str, where) -> tuple[LMConfig, Vocab]:
    try:
        data = json.loads(text)
        return LMConfig(**data["model"]), Vocab(tuple(data["vocab"]["symbols"]), data["vocab"]["level"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"{where} is not an attnlab checkpoint config ({type(e).__name__}: {e})") from None


def config_difference(saved: LMConfig, asked: LMConfig) -> str:
    """The fields that differ, as "n_layers 2 in the checkpoint, 3 asked; …"."""
    return "; ".join(f"{f.name} {getattr(saved, f.name)!r} in the checkpoint, {getattr(asked, f.name)!r} asked"
                     for f in fields(LMConfig) if getattr(saved, f.name) != getattr(asked, f.name))
