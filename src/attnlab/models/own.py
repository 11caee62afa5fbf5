"""attnlab's own family: the folders ``attnlab train --out DIR`` writes (:mod:`attnlab.lm.checkpoint`).

Its config.json says ``"model_type": "attnlab"`` (older ones hold a "model" and a "vocab" and no
model_type); the tensors already carry the stack's names, and the tokenizer is the checkpoint's own
character- or word-level :class:`attnlab.text.tokens.Vocab`.
"""

from __future__ import annotations

from pathlib import Path

from ..lm.checkpoint import TOKENIZER, load_checkpoint
from ..lm.model import FAMILY
from ..stack.transformer import Transformer
from ..text.tokens import Vocab, json_folder_tokenizer
from .families import Family, register


def is_own(config: dict) -> bool:
    return config.get("model_type") == FAMILY or ("model_type" not in config and {"model", "vocab"} <= set(config))


def load_own(folder: Path, config: dict) -> Transformer:
    return load_checkpoint(folder)[0]


def own_vocab(folder: Path, config: dict) -> Vocab:
    if (config.get("vocab") or {}).get("tokenizer") == TOKENIZER:
        return json_folder_tokenizer(folder)               # a fine-tuned model (attnlab train --from)
    try:
        return Vocab(tuple(config["vocab"]["symbols"]), config["vocab"]["level"])
    except (KeyError, TypeError) as e:
        raise ValueError(f"{Path(folder) / 'config.json'} has no readable vocabulary ({e!r})") from None


OWN = register(Family(name=FAMILY, matches=is_own, load=load_own, tokenizer=own_vocab,
                      title="attnlab's own (written by 'attnlab train --out')"))
