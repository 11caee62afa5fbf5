"""Indirect-object identification (Wang et al., 2022, "Interpretability in the Wild") on any decoder.

A prompt names two people, then repeats one of them (the subject, S) and asks for the other (the indirect
object, IO): "When Mary and John went to the store, John gave a drink to" → " Mary". The corrupted prompt
(Wang et al.'s "ABC" distribution) replaces the repeated name with a third one, so nothing tells the two
first names apart. The metric is the logit difference IO − S at the last token.

:func:`ioi_analysis` runs the recipe on a batch of such pairs (templates of different lengths: a padded
batch):

1. the logit difference of every clean and corrupted prompt;
2. direct logit attribution (DLA) of every head: its output at the last token, through the final norm
   frozen at the residual's own scale, onto W_U[IO] − W_U[S], averaged over the prompts;
3. activation patching of every head's output (clean into corrupted);
4. each head's attention from the last token to the IO and to the S name;
5. path patching of the heads that matter most into the final residual alone (their direct effect, every
   other head frozen).

A name mover (Wang et al.) writes IO − S directly (DLA > 0), attends from the last token to IO more than to
S, and restores the metric when patched.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..kernels._checks import as_positive_int, check_rng
from ..stack.hooks import run_with_cache
from ..stack.transformer import Transformer, check_decoder
from .patching import PatchGrid, pairs, patch, path_patch

NAMES = (" Mary", " John", " Tom", " James", " Sarah", " Anna", " Bob", " Alice", " David", " Emma", " Michael",
         " Lisa", " Paul", " Kate", " Mark", " Laura")
TEMPLATES = ("When{A} and{B} went to the store,{S} gave a drink to",      # each name brings its own space
             "When{A} and{B} went to the park,{S} gave a ball to",
             "After{A} and{B} went to the office,{S} handed a book to",
             "Then,{A} and{B} had a long argument, and afterwards{S} said to",
             "While{A} and{B} were working at the house,{S} gave a key to")


@dataclass(frozen=True, eq=False)
class IOIPrompts:
    """Clean and corrupted prompts (lists of token ids, pairs of one length) and the two answers."""
    texts: tuple[str, ...]
    clean: list
    corrupt: list
    io: np.ndarray              # (B,) token id of the indirect object (the answer)
    s: np.ndarray               # (B,) token id of the subject (the wrong answer)
    io_pos: np.ndarray          # (B,) position of the IO name in each prompt
    s_pos: np.ndarray           # (B,) position of the first S name


def ioi_prompts(tokenizer, n: int, *, rng: np.random.Generator) -> IOIPrompts:
    """``n`` IOI pairs: a template, two different names (in either order: ABB and BAB), and for the corrupted
    prompt a third name in place of the repeated one. Only names the tokenizer reads as one token are used."""
    n, rng = as_positive_int("n", n), check_rng(rng)
    one = [name for name in NAMES if tokenizer.encode(name).size == 1]
    if len(one) < 3:
        raise ValueError(f"the tokenizer reads fewer than 3 of the names {NAMES} as one token each")
    texts, clean, corrupt, io, s, io_pos, s_pos = [], [], [], [], [], [], []
    for i in range(n):
        template = TEMPLATES[i % len(TEMPLATES)]
        a, b, c = (one[j] for j in rng.choice(len(one), 3, replace=False))
        first, second = (a, b) if i % 2 == 0 else (b, a)           # IO first (ABB) or second (BAB)
        text = template.format(A=first, B=second, S=b)
        ids = tokenizer.encode(text)
        bad = tokenizer.encode(template.format(A=first, B=second, S=c))
        if ids.size != bad.size:
            raise ValueError(f"the clean and corrupted prompts of {template!r} tokenize to different lengths")
        ta, tb = int(tokenizer.encode(a)[0]), int(tokenizer.encode(b)[0])
        texts.append(text)
        clean.append(ids)
        corrupt.append(bad)
        io.append(ta)
        s.append(tb)
        io_pos.append(int(np.flatnonzero(ids == ta)[0]))
        s_pos.append(int(np.flatnonzero(ids == tb)[0]))
    return IOIPrompts(tuple(texts), clean, corrupt, np.array(io), np.array(s), np.array(io_pos), np.array(s_pos))


@dataclass(frozen=True, eq=False)
class IOIResult:
    """The recipe's figures; grids are (n_layers, n_heads)."""
    clean_diff: np.ndarray      # (B,) logit difference IO − S, clean prompts
    corrupt_diff: np.ndarray    # (B,) corrupted prompts
    dla: np.ndarray             # direct logit attribution onto IO − S, mean over the prompts
    patching: PatchGrid         # each head's output patched, clean into corrupted
    attn_io: np.ndarray         # attention from the last token to the IO name, mean over the prompts
    attn_s: np.ndarray          # to the (first) S name
    direct: dict                # (layer, head) -> path-patching share through the final residual alone

    def name_movers(self, *, k: int = 5) -> list[tuple[int, int]]:
        """The ``k`` heads of largest DLA that also attend to IO more than to S and restore when patched."""
        order = np.argsort(-self.dla, axis=None, kind="stable")
        out = []
        for flat in order:
            i, j = np.unravel_index(flat, self.dla.shape)
            if self.dla[i, j] > 0 and self.attn_io[i, j] > self.attn_s[i, j] and self.patching.restored[i, j] > 0:
                out.append((int(i), int(j)))
            if len(out) == k:
                break
        return out


def ioi_analysis(model: Transformer, prompts: IOIPrompts, *, path_top: int = 5, progress=None) -> IOIResult:
    """The IOI recipe (module docstring) on ``prompts``; ``path_top`` heads of largest patching share are
    path-patched into the final residual. ``progress(done, total)``, if given, is called after each patched
    pass (one per head, then one per path-patched head)."""
    check_decoder(model, "the IOI recipe")
    c = model.config
    L, H = c.n_layers, c.attention.n_heads
    names = [f"blocks.{i}.attn.hook_z" for i in range(L)] + [f"blocks.{i}.attn.hook_pattern" for i in range(L)]
    names += [f"blocks.{i}.hook_resid_pre" for i in range(L)] + [f"blocks.{L - 1}.hook_resid_post"]
    p = pairs(model, prompts.clean, prompts.corrupt)
    out, cache = run_with_cache(model, prompts.clean, names)
    rows = np.arange(len(p.last))
    last = out.logits[rows, p.last].astype(np.float64)                  # (B, vocab)
    clean_diff = last[rows, prompts.io] - last[rows, prompts.s]
    heads = cache.stack_head_results(apply_ln=True, pos_slice=-1)       # (L·H, B, d_model) left padding: −1
    dla = cache.logit_attrs(heads, prompts.io, prompts.s).mean(1).reshape(L, H)
    pad = p.clean.shape[1] - np.array([len(x) for x in prompts.clean])  # (B,)
    pattern = np.stack([cache[f"blocks.{i}.attn.hook_pattern"][rows, :, -1] for i in range(L)])   # (L, B, H, n)
    attn_io = pattern[:, rows, :, pad + prompts.io_pos].mean(0)         # (L, H) … indexing puts B first
    attn_s = pattern[:, rows, :, pad + prompts.s_pos].mean(0)
    path_top = min(as_positive_int("path_top", path_top), L * H)
    total = L * H + path_top

    def heads_done(done, _):
        if progress is not None:
            progress(done, total)
    grid = patch(model, prompts.clean, prompts.corrupt, answer=prompts.io, wrong=prompts.s, what="heads",
                 progress=heads_done)
    corrupt_out, _ = run_with_cache(model, prompts.corrupt, [])
    bad = corrupt_out.logits[rows, p.last].astype(np.float64)
    corrupt_diff = bad[rows, prompts.io] - bad[rows, prompts.s]
    top = np.argsort(-grid.restored, axis=None, kind="stable")[:path_top]
    direct = {}
    for done, flat in enumerate(top, L * H + 1):
        i, j = (int(v) for v in np.unravel_index(flat, (L, H)))
        r = path_patch(model, prompts.clean, prompts.corrupt, [(i, j)], [f"blocks.{L - 1}.hook_resid_post"],
                       answer=prompts.io, wrong=prompts.s)
        direct[(i, j)] = r.restored
        if progress is not None:
            progress(done, total)
    return IOIResult(clean_diff=clean_diff, corrupt_diff=corrupt_diff, dla=dla, patching=grid, attn_io=attn_io,
                     attn_s=attn_s, direct=direct)
