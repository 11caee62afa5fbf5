"""attnlab detect | ablate | patch | lens | scan: what trained heads do (also as ``attnlab interpret …``)."""

from __future__ import annotations

import numpy as np

from ._app import add_command, add_json_flag, positive_int, print_json, seed_arg
from ._model import add_model_option, load, model_arg
from ._progress import progress

DETECT_TEXT = "The cat sat on the mat"     # the tour's text for a trained model's heads
DETECT_REPEAT = 6                          # without TEXT, a model with its own vocabulary gets --repeat-random 6


def register(sub) -> None:
    add_commands(sub)
    p = add_command(sub, "interpret", help="what trained heads do: detect, ablate, patch, lens, scan",
                    beyond="docs/interpret.md",
                    shows="Shows what trained heads do through five commands, each also a command of its own",
                    examples=("attnlab interpret detect --model induction", "attnlab interpret lens '|abcab' "
                              "--model induction --top 1"))
    add_commands(p.add_subparsers(title="commands", metavar="COMMAND"))


def add_commands(sub) -> None:
    p = add_command(sub, "detect", help="score every head as a previous-token, duplicate-token or induction head",
                    beyond="docs/interpret.md",
                    shows="Shows every head's score as a previous-token, duplicate-token and induction head: the "
                          "share of its attention on the pattern's cells, as TransformerLens's detectors define it",
                    more="The tour's section “What trained heads do”.",
                    examples=("attnlab detect                 # MiniLM on 'The cat sat on the mat'",
                              "attnlab detect --model induction --repeat-random 6 --exclude-bos"))
    p.add_argument("text", nargs="?", help=f"the text to run (default {DETECT_TEXT!r}, the tour's; for a model "
                   f"with its own vocabulary, such as --model induction, --repeat-random {DETECT_REPEAT})")
    add_model_option(p, default="minilm")
    p.add_argument("--kind", default="all", help="previous_token, duplicate_token, induction or all (default)")
    p.add_argument("--repeat-random", type=int, metavar="N", help="N random token ids repeated twice (the "
                   "standard induction test) instead of TEXT")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of --repeat-random (default 0)")
    p.add_argument("--exclude-bos", action="store_true", help="leave the first key's weight out")
    p.add_argument("--exclude-current-token", action="store_true", help="leave each query's own key out")
    p.add_argument("--top", type=positive_int, default=3, help="heads listed per detector (default 3)")
    p.add_argument("--png", metavar="FILE", help="a layer × head heatmap per detector")
    add_json_flag(p)
    p.set_defaults(func=cmd_detect)

    p = add_command(sub, "ablate", help="the change in next-token loss when each head is removed (causal LMs)",
                    beyond="docs/interpret.md",
                    shows="Shows how much a causal model's next-token loss on TEXT rises when each head's output "
                          "is zeroed, or replaced by a causal mean or another text's",
                    examples=("attnlab ablate '|abcdefgabcdefg' --model induction",
                              "attnlab ablate '|abcdefgabcdefg' '|hijklmnhijklmn' --model induction --mode mean"))
    p.add_argument("text", metavar="TEXT", nargs="+", help="at least 2 tokens; several texts of the same number "
                   "of tokens are a batch (the loss is their mean; modes mean and resample take the other texts)")
    add_model_option(p, default="smollm2", decoder=True)
    p.add_argument("--mode", default="zero", choices=("zero", "mean", "prefix-mean", "resample"),
                   help="zero the head's output; mean: its mean at each position over the other texts; "
                   "prefix-mean: its running mean over the text's positions so far; resample: its output in "
                   "another text (default zero). Each keeps a causal model causal")
    p.add_argument("--png", metavar="FILE", help="a layer × head heatmap of the change")
    add_json_flag(p)
    p.set_defaults(func=cmd_ablate)

    p = add_command(sub, "patch", help="activation patching: what each head and each layer's residual at each "
                    "position restores of the clean logit difference", beyond="docs/interpret.md",
                    shows="Shows activation patching: the share of the clean run's logit difference that one "
                          "head's clean output, or one layer's clean residual at one position, restores",
                    more="It runs one forward pass per head and per layer and position: on SmolLM2, 690 passes. "
                         "For a fast first look, 'attnlab attribute --no-patch' (same options) estimates both grids "
                         "from one forward and one backward pass, in seconds; then patch what it points to.",
                    examples=("attnlab patch --model induction --clean '|abcdefgabcde' --corrupt '|abcdzfgabcde' "
                              "--answer f --wrong g",))
    add_model_option(p, default="smollm2", decoder=True)
    p.add_argument("--clean", required=True, metavar="TEXT")
    p.add_argument("--corrupt", required=True, metavar="TEXT", help="as many tokens as --clean")
    p.add_argument("--answer", required=True, metavar="TOKEN", help="the clean run's answer, one token "
                   "(GPT-2: mind the leading space, ' Mary')")
    p.add_argument("--wrong", required=True, metavar="TOKEN", help="the competing token")
    p.add_argument("--png", metavar="FILE", help="the layer × head and layer × position grids")
    add_json_flag(p)
    p.set_defaults(func=cmd_patch)

    p = add_command(sub, "attribute", help="attribution patching: every head's and residual position's share of "
                    "the clean logit difference, estimated from one forward and one backward pass",
                    beyond="docs/backward.md",
                    shows="Shows attribution patching: gradient × (clean − corrupt) activation for every head's "
                          "output and every residual position, beside activation patching's measurement",
                    examples=("attnlab attribute --model induction --clean '|abcdefgabcde' --corrupt "
                              "'|abcdzfgabcde' --answer f --wrong g",))
    add_model_option(p, required=True, decoder=True)
    p.add_argument("--clean", required=True, metavar="TEXT")
    p.add_argument("--corrupt", required=True, metavar="TEXT", help="as many tokens as --clean")
    p.add_argument("--answer", required=True, metavar="TOKEN", help="the clean run's answer, one token")
    p.add_argument("--wrong", required=True, metavar="TOKEN", help="the competing token")
    p.add_argument("--no-patch", action="store_true", help="skip activation patching (one forward pass per "
                   "head and per layer and position) and its comparison")
    p.add_argument("--top", type=positive_int, default=5, help="heads listed where the two disagree most (default 5)")
    add_json_flag(p)
    p.set_defaults(func=cmd_attribute)

    p = add_command(sub, "lens", help="the logit lens: each layer's residual stream read as next-token guesses",
                    beyond="docs/interpret.md",
                    shows="Shows the logit lens: at each position, each layer's residual stream read through the "
                          "final norm and unembedding as next-token guesses",
                    examples=("attnlab lens '|abcdefgabcde' --model induction --top 2",
                              "attnlab lens 'The capital of France is' --top 2   # SmolLM2, the default"))
    p.add_argument("text", metavar="TEXT")
    add_model_option(p, default="smollm2", decoder=True)
    p.add_argument("--top", type=positive_int, default=3, help="tokens per position and layer (default 3)")
    p.add_argument("--position", metavar="LIST", help="the positions shown: -1 (the last, whose guesses are "
                   "the next token's), 0,3 or 2-5 (default all)")
    p.add_argument("--layers", metavar="LIST", help="the stages shown, by block: the stream after block 3, -1 (the "
                   "last: the model's output), 0,4,7 or 2-5 (default: the embedding and every block)")
    add_json_flag(p)
    p.set_defaults(func=cmd_lens)

    p = add_command(sub, "ioi", help="indirect-object identification (Wang et al., 2022): logit differences, direct "
                    "logit attribution, patching and path patching per head",
                    beyond="docs/interpret.md",
                    shows="Shows indirect-object identification on a decoder: each prompt's logit difference, every "
                          "head's direct logit attribution, patching and path patching, and the name-mover-like heads",
                    examples=("attnlab ioi --prompts 4 --path-top 3   # SmolLM2, the default; minutes on 2 cores",))
    add_model_option(p, default="smollm2", decoder=True)
    p.add_argument("--prompts", type=int, default=8, help="clean/corrupted pairs (default 8)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the names drawn (default 0)")
    p.add_argument("--path-top", type=int, default=5, help="heads path-patched into the final residual (default 5)")
    p.add_argument("--top", type=positive_int, default=8, help="heads listed (default 8)")
    add_json_flag(p)
    p.set_defaults(func=cmd_ioi)

    from .scan import add_scan
    add_scan(sub)


def special_ids(tokenizer) -> tuple[list[int], list[int]]:
    """The ids a tokenizer puts before and after a text ([CLS] … [SEP] for BERT, <|endoftext|> before for
    GPT-2, the induction task's BOS "|" for its checkpoints), to wrap a random sequence the same way."""
    from ..text.tokens import HFTokenizer, Vocab
    if isinstance(tokenizer, HFTokenizer):
        if tokenizer.byte_level:
            eot = tokenizer.tokenizer.token_to_id("<|endoftext|>")
            return ([] if eot is None else [eot]), []
        ids = tokenizer.tokenizer.encode("").ids
        return ids[:1], ids[1:]
    if isinstance(tokenizer, Vocab) and "|" in tokenizer.symbols:
        return [tokenizer.symbols.index("|")], []
    return [], []


def text_tokens(ids: np.ndarray, tokenizer) -> int:
    """How many of ``ids`` are the text's own, not the specials the tokenizer wraps it in ([CLS], [SEP])."""
    before, after = special_ids(tokenizer)
    n = ids.size
    if before and list(ids[:len(before)]) == before:
        n -= len(before)
    if after and list(ids[ids.size - len(after):]) == after:
        n -= len(after)
    return n


def own_vocabulary(tokenizer) -> bool:
    """A vocabulary of its own (an ``attnlab train`` folder, the induction model), which English may not fit."""
    from ..text.tokens import Vocab
    return isinstance(tokenizer, Vocab)


def detect_ids(args, model, tokenizer) -> np.ndarray:
    from ..interpret import repeated_random_tokens
    if args.text is not None and args.repeat_random is not None:
        raise ValueError("give either TEXT or --repeat-random N, not both")
    if args.text is not None:
        return tokenizer.encode(args.text)
    if args.repeat_random is None and not own_vocabulary(tokenizer):
        return tokenizer.encode(DETECT_TEXT)
    n = DETECT_REPEAT if args.repeat_random is None else args.repeat_random
    if n < 1:
        raise ValueError(f"--repeat-random must be a positive integer, got {n}")
    before, after = special_ids(tokenizer)
    total = 2 * n + len(before) + len(after)
    if total > model.config.n_ctx:                      # the positions it has (RoPE: the context it was trained on)
        raise ValueError(f"--repeat-random {n} makes {total} tokens (2 × {n}"
                         f"{f' + {len(before) + len(after)} special' if before or after else ''}), more than the "
                         f"model's {model.config.n_ctx} positions; use N <= "
                         f"{(model.config.n_ctx - total + 2 * n) // 2}")
    r = repeated_random_tokens(n, vocab_size=model.config.vocab_size, rng=np.random.default_rng(args.seed),
                               avoid=before + after)
    return np.concatenate([before, r, after]).astype(np.int64)


def cmd_detect(args) -> int:
    from ..interpret import detect_heads, top_heads
    from ..interpret.detect import check_kinds
    kinds = check_kinds(args.kind)
    model, tokenizer = load(args)
    ids = detect_ids(args, model, tokenizer)
    own = text_tokens(ids, tokenizer)
    if own < 2:
        raise ValueError(f"the text has {own} token; detectors need at least 2 (the first has no earlier token "
                         "to score)")
    scores = detect_heads(model, ids, kinds, exclude_bos=args.exclude_bos,
                          exclude_current_token=args.exclude_current_token)
    tokens = list(tokenizer.labels(ids))
    if args.png:
        from ..interpret.figures import save_head_grids
        save_head_grids(args.png, {k.replace("_", " "): v for k, v in scores.items()},
                        title=f"{model_arg(args)}: detector scores")
    if args.json:
        print_json({"model": model_arg(args), "tokens": tokens, "scores": scores})
        return 0
    c = model.config
    on = (f" on {args.text!r}" if args.text is not None else "" if args.repeat_random is not None else
          f" on {DETECT_REPEAT} random tokens repeated (--repeat-random {DETECT_REPEAT}, the default without TEXT "
          "for a model with its own vocabulary)" if own_vocabulary(tokenizer) else f" on {DETECT_TEXT!r}")
    print(f"{model_arg(args)}{on}: {len(tokens)} tokens, {c.n_layers} layers × {c.attention.n_heads} heads"
          f"{'' if c.is_causal else ' (bidirectional: the patterns are scored on the full grid)'}")
    for k, s in scores.items():
        best = ", ".join(f"L{i}H{j} {v:.3f}" for i, j, v in top_heads(s, args.top))
        print(f"{k:>16}: {best}")
    if args.png:
        print(f"wrote {args.png}")
    return 0


def cmd_ablate(args) -> int:
    from ..interpret import ablate
    rows = []

    def check(tokenizer, n_ctx):           # before the weights load: a bad text fails at once
        rows.extend(encode_text(tokenizer, t, "TEXT", least=2, why="one to predict from, one to predict")
                    for t in args.text)
        if len({r.size for r in rows}) != 1:
            raise ValueError(f"the texts must have the same number of tokens, got {[r.size for r in rows]}")
        if args.mode in ("mean", "resample") and len(rows) < 2:
            raise ValueError(f"--mode {args.mode} takes each position's output from the other texts: give at "
                             "least 2 texts of the same number of tokens, or use --mode prefix-mean")
    model, tokenizer = load(args, "ablation", check=check)
    ids = rows[0] if len(rows) == 1 else np.stack(rows)                 # (n,) or (B, n)
    with progress(f"ablating each head ({args.mode})", quiet=args.json) as step:
        r = ablate(model, ids, mode=args.mode, progress=step)
    if args.png:
        from ..interpret.figures import save_head_grids
        save_head_grids(args.png, {f"loss change, {args.mode} ablation (nats)": r.delta}, diverging=True,
                        title=f"{model_arg(args)}: intact loss {r.loss:.3f}")
    if args.json:
        print_json({"model": model_arg(args), "tokens": [list(tokenizer.labels(t)) for t in rows], "mode": r.mode,
                    "loss": r.loss,
                    "ablated": r.ablated, "delta": r.delta})
        return 0
    print(f"{model_arg(args)}: next-token loss {r.loss:.4f} nats on {len(rows)} × {rows[0].size} tokens; with one "
          "head "
          f"removed "
          f"({args.mode}), the change:")
    print_grid(r.delta, [f"H{h}" for h in range(r.delta.shape[1])], width=8, digits=4)
    i, j = np.unravel_index(np.argmax(r.delta), r.delta.shape)
    print(f"the head it misses most: layer {i}, head {j} (+{r.delta[i, j]:.4f} nats)")
    return 0


def print_grid(grid: np.ndarray, columns: list[str], *, width: int, digits: int) -> None:
    """A (n_layers, n_columns) grid of signed numbers, a row per layer under the column labels."""
    print("layer " + " ".join(f"{c:>{width}}" for c in columns))
    for i, row in enumerate(grid):
        print(f"{i:>5} " + " ".join(f"{v:+{width}.{digits}f}" for v in row))


def encode_text(tokenizer, text: str, what: str, *, least: int, why: str) -> np.ndarray:
    """``text``'s ids (n,), refused by the name the learner typed when it holds fewer than ``least`` tokens."""
    ids = tokenizer.encode(text)                                    # (n,)
    if ids.size < least:
        raise ValueError(f"{what} must hold at least {least} tokens ({why}); {text!r} is {ids.size}: "
                         f"{list(tokenizer.labels(ids))}")
    return ids


def one_token(tokenizer, text: str, what: str) -> int:
    ids = tokenizer.encode(text)
    if ids.size != 1:
        raise ValueError(f"{what} must be one token, {text!r} is {ids.size}: {list(tokenizer.labels(ids))}")
    return int(ids[0])


class PatchTexts:
    """--clean, --corrupt, --answer and --wrong encoded and checked as the tokenizer sees them, before the
    weights load (``load(args, what, check=PatchTexts(args))``); then ``.clean``, ``.corrupt`` (n,) and the two
    token ids."""

    def __init__(self, args, *, least: int):
        self.args, self.least = args, least

    def __call__(self, tokenizer, n_ctx=None) -> None:
        a = self.args
        self.clean = encode_text(tokenizer, a.clean, "--clean", least=self.least,
                                 why="the answer is read at the last one")
        self.corrupt = tokenizer.encode(a.corrupt)
        if self.clean.size != self.corrupt.size:
            raise ValueError(f"--clean has {self.clean.size} tokens and --corrupt {self.corrupt.size}; they must "
                             f"have the same number (--clean {list(tokenizer.labels(self.clean))}, --corrupt "
                             f"{list(tokenizer.labels(self.corrupt))})")
        self.answer, self.wrong = one_token(tokenizer, a.answer, "--answer"), one_token(tokenizer, a.wrong, "--wrong")


def cmd_patch(args) -> int:
    from ..interpret import patch
    t = PatchTexts(args, least=2)
    model, tokenizer = load(args, "patching", check=t)
    clean, corrupt = t.clean, t.corrupt
    with progress("patching heads, then residual positions", quiet=args.json) as step:
        r = patch(model, clean, corrupt, answer=t.answer, wrong=t.wrong, progress=step)
    tokens = list(tokenizer.labels(clean))
    if args.png:
        from ..interpret.figures import save_head_grids
        save_head_grids(args.png, {"one head's z": r.heads}, title=f"{model_arg(args)}: share of the clean logit "
                        f"difference restored", diverging=True)
        resid_png = str(args.png).removesuffix(".png") + "_resid.png"
        save_head_grids(resid_png, {"residual stream into the layer": r.resid}, xlabel="position",
                        xticks=tokens, diverging=True, title=f"{model_arg(args)}: share restored, one position")
    if args.json:
        print_json({"model": model_arg(args), "tokens": tokens, "corrupt_tokens": list(tokenizer.labels(corrupt)),
                    "answer": args.answer, "wrong": args.wrong, "clean_logit_diff": r.clean,
                    "corrupt_logit_diff": r.corrupt, "heads": r.heads, "resid": r.resid})
        return 0
    print(f"logit difference {args.answer!r} − {args.wrong!r}: clean {r.clean:+.3f}, corrupted {r.corrupt:+.3f}")
    print("share restored by patching one head's clean output (0 = none, 1 = all):")
    print_grid(r.heads, [f"H{h}" for h in range(r.heads.shape[1])], width=6, digits=2)
    print("share restored by patching one layer's clean residual stream at one position:")
    from .attend import label
    print_grid(r.resid, [label(t) for t in tokens], width=8, digits=2)
    if args.png:
        print(f"wrote {args.png} and {resid_png}")
    return 0


def cmd_attribute(args) -> int:
    import time

    from ..interpret import attribute, compare, patch
    t = PatchTexts(args, least=1)
    model, tokenizer = load(args, "attribution patching", check=t)
    clean, corrupt, answer, wrong = t.clean, t.corrupt, t.answer, t.wrong
    t0 = time.perf_counter()
    a = attribute(model, clean, corrupt, answer=answer, wrong=wrong)
    seconds = {"attribution": time.perf_counter() - t0}
    r = agreement = None
    if not args.no_patch:
        t0 = time.perf_counter()
        with progress("activation patching, to compare", quiet=args.json) as step:
            r = patch(model, clean, corrupt, answer=answer, wrong=wrong, progress=step)
        seconds["activation_patching"] = time.perf_counter() - t0
        agreement = compare(r, a, top=args.top)
    tokens = list(tokenizer.labels(clean))
    if args.json:
        print_json({"model": model_arg(args), "tokens": tokens, "answer": args.answer, "wrong": args.wrong,
                    "clean_logit_diff": a.clean, "corrupt_logit_diff": a.corrupt, "heads": a.heads,
                    "resid": a.resid, "seconds": seconds,
                    "patching": None if r is None else {"heads": r.heads, "resid": r.resid},
                    "agreement": None if agreement is None else {
                        "heads_rank_correlation": agreement.heads_rho, "resid_rank_correlation": agreement.resid_rho,
                        "disagree": [{"layer": i, "head": j, "patching": m, "attribution": e}
                                     for i, j, m, e in agreement.disagree]}})
        return 0
    from .attend import label
    print(f"logit difference {args.answer!r} − {args.wrong!r}: clean {a.clean:+.3f}, corrupted {a.corrupt:+.3f}")
    print(f"attribution patching ({seconds['attribution']:.2f} s, one forward and one backward): estimated share "
          "restored by one head's clean output:")
    print_grid(a.heads, [f"H{h}" for h in range(a.heads.shape[1])], width=6, digits=2)
    print("estimated share restored by one layer's clean residual stream at one position:")
    print_grid(a.resid, [label(t) for t in tokens], width=8, digits=2)
    if agreement is not None:
        print(f"against activation patching ({seconds['activation_patching']:.1f} s): Spearman's rank "
              f"correlation {agreement.heads_rho:.3f} over heads, {agreement.resid_rho:.3f} over residual "
              f"positions; where they disagree most:")
        for i, j, m, e in agreement.disagree:
            print(f"  layer {i} head {j}: patching {m:+.3f}, attribution {e:+.3f}")
    return 0


def cmd_lens(args) -> int:
    from ..interpret import logit_lens
    from .attend import label, pick
    model, tokenizer = load(args, "the logit lens")
    ids = tokenizer.encode(args.text)
    lens = logit_lens(model, ids, top=args.top)
    tokens = list(tokenizer.labels(ids))
    positions = pick(args.position, "--position", len(tokens), "position")
    stages = list(range(len(lens.stages))) if args.layers is None else \
        [1 + i for i in pick(args.layers, "--layers", model.config.n_layers, "layer")]   # stage 0: the embedding
    note = bos_note(tokenizer, ids, args.text, f"attnlab lens '{{text}}' --model {model_arg(args)}")
    if args.json:
        print_json({"model": model_arg(args), "tokens": tokens, "positions": positions,
                    "stages": [lens.stages[s] for s in stages], "note": note,
                    "top": [[[{"token": tokenizer.labels([t])[0], "id": int(t), "p": float(p)}
                              for t, p in zip(lens.top_ids[s, pos], lens.top_probs[s, pos])] for pos in positions]
                            for s in stages]})
        return 0
    print(f"{model_arg(args)}: the top {args.top} next tokens at each position, reading the residual stream after "
          "each stage through the final norm and unembedding (the last stage is the model's output)")
    for pos in positions:
        print(f"after {label(tokens[pos])!s} (position {pos}):")
        for s in stages:
            guesses = "  ".join(f"{label(tokenizer.labels([t])[0])} {p:.2f}"
                                for t, p in zip(lens.top_ids[s, pos], lens.top_probs[s, pos]))
            print(f"  {lens.stages[s]:>9}: {guesses}")
    if note:
        print(note)
    return 0


def cmd_ioi(args) -> int:
    from ..interpret import top_heads
    from ..interpret.ioi import ioi_analysis, ioi_prompts
    for flag, v in (("--prompts", args.prompts), ("--path-top", args.path_top), ("--top", args.top)):
        if v < 1:
            raise ValueError(f"{flag} must be a positive integer, got {v}")
    model, tokenizer = load(args, "the IOI recipe")
    prompts = ioi_prompts(tokenizer, args.prompts, rng=np.random.default_rng(args.seed))
    with progress(f"IOI: patching each head, then path-patching {args.path_top}", quiet=args.json) as step:
        r = ioi_analysis(model, prompts, path_top=args.path_top, progress=step)
    movers = r.name_movers(k=args.top)
    if args.json:
        print_json({"model": model_arg(args), "texts": list(prompts.texts), "clean_diff": r.clean_diff,
                    "corrupt_diff": r.corrupt_diff, "dla": r.dla, "patched": r.patching.restored,
                    "attn_io": r.attn_io, "attn_s": r.attn_s,
                    "direct": [{"layer": i, "head": j, "restored": v} for (i, j), v in r.direct.items()],
                    "name_movers": [list(h) for h in movers]})
        return 0
    print(f"{model_arg(args)}: {len(prompts.texts)} IOI prompts, logit difference IO − S at the last token")
    for text, c, k in zip(prompts.texts, r.clean_diff, r.corrupt_diff):
        print(f"  {c:+7.3f} (corrupted {k:+7.3f})  {text!r}")
    print(f"mean {r.clean_diff.mean():+.3f}, corrupted {r.corrupt_diff.mean():+.3f}")

    def row(i, j):
        return (f"L{i}H{j}: DLA {r.dla[i, j]:+.3f}, patched {r.patching.restored[i, j]:+.3f}, attention from the "
                f"last token to IO {r.attn_io[i, j]:.3f} / to S {r.attn_s[i, j]:.3f}")
    print("heads of largest direct logit attribution:")
    for i, j, _ in top_heads(r.dla, args.top):
        print("  " + row(i, j))
    print("heads whose patched output restores the most:")
    for i, j, _ in top_heads(r.patching.restored, args.top):
        print("  " + row(i, j))
    print("path patching into the final residual alone (the head's direct effect, other heads frozen):")
    for (i, j), v in r.direct.items():
        print(f"  L{i}H{j}: {v:+.3f}")
    print("name-mover-like heads (DLA > 0, attend to IO more than S, restore when patched): "
          + (", ".join(f"L{i}H{j}" for i, j in movers) or "none"))
    return 0


def bos_note(tokenizer, ids: np.ndarray, text: str, command: str) -> str | None:
    """A hint when a model trained on sequences that open with its BOS symbol (the induction task's "|")
    is given a text without it: every position then sits where training never put it."""
    from ..text.tokens import Vocab
    before, _ = special_ids(tokenizer)
    if not (isinstance(tokenizer, Vocab) and before) or list(ids[:len(before)]) == before:
        return None
    bos = tokenizer.decode(before)
    return (f"note: this model was trained on sequences that start with {bos!r} (its beginning-of-sequence "
            f"token), and {text!r} does not; its guesses here are out of what it learned. Try: "
            + command.format(text=bos + text))
