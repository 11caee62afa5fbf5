"""attnlab context: one word in two sentences, through a trained model, layer by layer (the guide's two gaps)."""

from __future__ import annotations

import numpy as np

from ._app import GUIDE_OPENING, add_command, add_json_flag, print_json
from ._model import add_model_option, load


def register(sub) -> None:
    p = add_command(sub, "context", help="cosine of a word's vector in two sentences, and of the sentences, "
                    "at every layer of a trained model", section=GUIDE_OPENING,
                    shows="Shows the two gaps of the guide's opening closed on a trained model: the cosine between "
                          "WORD's vector in two sentences, and between the sentences, after every layer",
                    more="The tour's section “The two gaps, closed on a real model”; see docs/trained.md.",
                    examples=("attnlab context bank 'we sat on the river bank' 'the bank lent her the money'",
                              "attnlab context the 'the cat saw the dog' 'the dog saw the cat' --index 1 0"))
    p.add_argument("word", metavar="WORD", help="a word that occurs in both sentences, e.g. bank")
    p.add_argument("sentence_a", metavar="SENTENCE_A", help="e.g. 'we sat on the river bank'")
    p.add_argument("sentence_b", metavar="SENTENCE_B", help="e.g. 'the bank lent her the money'")
    add_model_option(p, default="minilm")
    p.add_argument("--index", type=int, nargs="+", default=[0], metavar="I",
                   help="which occurrence of WORD to take, counted from 0 (default 0, the first); two numbers "
                        "pick one per sentence, e.g. --index 1 0")
    p.add_argument("--png", metavar="FILE", help="also draw both cosines against the layer into this PNG")
    add_json_flag(p)
    p.set_defaults(func=cmd_context)


def cmd_context(args) -> int:
    from ..guide.context import compare_in_context

    if len(args.index) > 2:
        raise ValueError(f"--index takes one number (both sentences) or two (one each), got {len(args.index)}")
    index = args.index[0] if len(args.index) == 1 else tuple(args.index)
    r = compare_in_context(args.word, args.sentence_a, args.sentence_b, load(args),
                           index=index)
    if args.png:
        from ..viz.charts import save_context
        save_context(args.png, r)
    if args.json:
        print_json(context_data(r))
        return 0
    print(context_text(r))
    if args.png:
        print(f"wrote {args.png}")
    return 0


def context_data(r) -> dict:
    """The --json shape: one entry per hidden state (embeddings first), and the W_E rows alone beside."""
    return {"word": r.word, "layers": list(r.layers), "word_cosine": r.word_cosine,
            "sentence_cosine": r.sentence_cosine, "model": r.model, "causal": r.causal, "sentences": list(r.sentences),
            "tokens": [list(t) for t in r.tokens], "word_tokens": [list(p) for p in r.pieces],
            "occurrence": list(r.occurrence), "n_occurrences": list(r.n_occurrences),
            "token_rows": {"word_cosine": r.rows_word_cosine, "sentence_cosine": r.rows_sentence_cosine}}


def context_text(r) -> str:
    """A table of both cosines per hidden state, with what to notice."""
    pieces = ["+".join(r.tokens[s][i] for i in r.pieces[s]) for s in (0, 1)]
    rows = [("token rows W_E alone (no positions, no attention)", r.rows_word_cosine, r.rows_sentence_cosine)]
    rows += [("embeddings (+ positions, normalised)" if name == "embeddings" else f"after {name}", w, s)
             for name, w, s in zip(r.layers, r.word_cosine, r.sentence_cosine)]
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{r.model}: cosine between {r.word!r} in A and in B, and between the mean-pooled sentences",
             f"A: {r.sentences[0]!r}  ({r.word!r} is token {pieces[0]} at {list(r.pieces[0])}{which(r, 0)})",
             f"B: {r.sentences[1]!r}  ({r.word!r} is token {pieces[1]} at {list(r.pieces[1])}{which(r, 1)})",
             f"{'hidden state'.ljust(width)}  {'word':>7}  {'sentence':>8}"]
    lines += [f"{name.ljust(width)}  {w:7.4f}  {s:8.4f}" for name, w, s in rows]
    lines += notice(r)
    return "\n".join(lines)


def which(r, s: int) -> str:
    """Which occurrence of the word a sentence's vector is, when the word occurs more than once."""
    if r.n_occurrences[s] < 2:
        return ""
    return (f"; occurrence {r.occurrence[s]} of {r.n_occurrences[s]}, counted from 0: --index picks "
            "another")


def notice(r) -> list[str]:
    """Two or three sentences on what the numbers show."""
    out = []
    if r.causal:
        out.append(f"{r.model} is a decoder: each token sees only the tokens to its left, never the ones after it. "
                   f"So {r.word!r} can take in only the words before it in each sentence; whatever follows it "
                   "(in 'the bank lent her the money', the words that say which bank) cannot change its vector. "
                   "An encoder such as minilm sees both sides.")
    w = r.word_cosine
    low = int(np.argmin(w))
    if r.rows_word_cosine > 1 - 1e-9:
        where = "at the embedding layer" if low == 0 else "after " + r.layers[low]
        drift = (f"to {w[-1]:.4f} after {r.layers[-1]}" if low == len(w) - 1 else
                 f"lowest at {w[low]:.4f} {where}, and {w[-1]:.4f} after {r.layers[-1]}, the last")
        out.append(f"Before attention {r.word!r} is one row of the table in both sentences (cosine 1). Each layer "
                   f"mixes in the words around it, and its two vectors drift apart, {drift}: a contextual vector.")
        if r.pieces[0] != r.pieces[1] and w[0] < 1 - 1e-9:
            out.append(f"At the embedding layer the cosine ({w[0]:.4f}) is below 1 only because {r.word!r} sits at "
                       f"different positions ({list(r.pieces[0])} and {list(r.pieces[1])}), which add different "
                       "position rows.")
    same_words = sorted(r.tokens[0]) == sorted(r.tokens[1])
    if same_words:
        out.append(f"The sentences hold the same tokens, so their mean token rows are identical (cosine "
                   f"{r.rows_sentence_cosine:.4f}); with positions and attention the means differ "
                   f"({r.sentence_cosine[-1]:.4f} after the last layer): the vectors now carry the word order.")
    return out
