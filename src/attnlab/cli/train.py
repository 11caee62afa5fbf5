"""attnlab train: a small attention language model on any UTF-8 text, beside the n-gram floors."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ._app import add_command, add_json_flag, positive_int, print_json, seed_arg, stderr_progress

if TYPE_CHECKING:
    from ..text.tokens import Vocab

FLOOR_MAX_K = 3          # floors shown for k = 0 … 3
BASELINE_KS = (1, 2)     # the add-α predictors the model is set beside


def register(sub) -> None:
    from ..layer.positions import POSITION_SCHEMES

    p = add_command(sub, "train", help="train a small attention language model on a text and compare it with "
                    "the n-gram floors", section="Why context pays",
                    shows="Shows a small attention-only language model trained on a text (the guide's toy text, or "
                          "MY_TEXT.txt), its loss beside the n-gram floors and counting",
                    more="With --task induction it grows an induction head instead; see docs/lm.md and "
                         "docs/interpret.md.",
                    examples=("attnlab train --steps 100", "attnlab train --steps 100 --out lm   # then: attnlab "
                              "generate lm --prompt 'the '"))
    p.add_argument("file", nargs="?", metavar="FILE", help="UTF-8 text (default: the guide's toy text)")
    p.add_argument("--from", dest="from_model", metavar="MODEL", help="fine-tune this model (a GPT-2 or "
                   "Llama-family folder, or one 'attnlab train' wrote) on FILE instead of training a new one; "
                   "its own tokenizer; --out gets a folder every command reads")
    p.add_argument("--train-only", default="all", choices=("all", "attention", "last-k-layers"),
                   help="with --from: update every parameter (default), only the attention layers', or only "
                   "the last --last-k blocks' and the head's")
    p.add_argument("--last-k", type=int, default=2, metavar="K", help="blocks --train-only last-k-layers updates "
                   "(default 2)")
    p.add_argument("--task", default="text", choices=("text", "induction"), help="text: next tokens of FILE "
                   "(default); induction: repeated random tokens, to grow an induction head (Olsson et al.)")
    p.add_argument("--steps", type=int, default=None, help="training steps (default 300; induction 1000)")
    p.add_argument("--context", type=int, default=None, help="tokens per window, n_ctx (default 32; induction 24)")
    p.add_argument("--layers", type=int, default=2, help="layers (default 2)")
    p.add_argument("--block", default="attention", choices=("attention", "gpt"), help="attention: attention-only "
                   "blocks, the guide's (default); gpt: GPT-2's pre-norm blocks with a LayerNorm and an MLP, "
                   "as nanoGPT trains them")
    p.add_argument("--heads", type=int, default=None, help="heads per layer (default 4; induction 2)")
    p.add_argument("--d-model", type=int, default=64, help="width of a token's vector (default 64)")
    p.add_argument("--positions", default=None, choices=list(POSITION_SCHEMES),
                   help="position scheme (default learned; induction rope)")
    p.add_argument("--rope-theta", type=float, default=None, metavar="THETA",
                   help="RoPE's base θ (default 10000; only with --positions rope)")
    p.add_argument("--kv-heads", type=int, default=None, help="key/value heads, a divisor of --heads "
                   "(grouped-query attention; default: as many as --heads)")
    p.add_argument("--level", default="char", choices=("char", "word"), help="tokens: characters or words")
    p.add_argument("--batch", type=positive_int, default=None, help="windows per step (default 16; induction 32)")
    p.add_argument("--lr", type=float, default=None, help="Adam's learning rate (default 3e-3; induction 1e-2)")
    p.add_argument("--weight-decay", type=float, default=0.0, help="AdamW's decoupled decay of the matrices "
                   "(default 0; 1.0 with --lr 0.01 suits a 27 KB text)")
    p.add_argument("--clip", type=float, default=None, metavar="NORM", help="scale the gradients down to this "
                   "global norm when above it (nanoGPT: 1.0; default: no clipping)")
    p.add_argument("--schedule", default="cosine", choices=("constant", "cosine"),
                   help="learning rate: constant, or cosine (the default): a cosine decay to 0.1× over the steps")
    p.add_argument("--heldout", type=float, default=0.1, help="fraction of the text kept for evaluation "
                   "(default 0.1, its tail)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the one random generator (default 0)")
    p.add_argument("--out", metavar="DIR", help="save the checkpoint here (every --save-every steps and at the end)")
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints (default 100)")
    p.add_argument("--resume", action="store_true", help="go on from the checkpoint in --out to --steps in "
                   "all (same configuration, vocabulary, --lr, --batch, --weight-decay and --schedule required, and "
                   "under the cosine schedule the same --steps, which lays it out): Adam's moments, the step and the "
                   "random generator are restored, so the run ends bit for bit where an uninterrupted one ends")
    add_json_flag(p)
    p.set_defaults(func=cmd_train)


@dataclass(frozen=True)
class Data:
    """A text split for training: the vocabulary and the ids of its head and held-out tail."""
    vocab: Vocab
    train: np.ndarray       # (n_train,)
    heldout: np.ndarray     # (n_heldout,)


def load_data(file, level: str, heldout: float) -> Data:
    from ..guide.toy import TOY_TEXT
    from ..lm.training import split_heldout
    from ..text.ngrams import read_utf8
    from ..text.tokens import Vocab

    text = TOY_TEXT if file is None else read_utf8(file)
    vocab = Vocab.from_text(text, level)
    train, tail = split_heldout(vocab.encode(text), heldout)
    return Data(vocab=vocab, train=train, heldout=tail)


TEXT_DEFAULTS = {"steps": 300, "context": 32, "heads": 4, "positions": "learned", "batch": 16, "lr": 3e-3}


FINETUNE_DEFAULTS = {"steps": 20, "context": 128, "batch": 4, "lr": 1e-4}


def cmd_finetune(args) -> int:
    """attnlab train --from MODEL FILE: go on training a real model on a text, held-out loss before and after."""
    import dataclasses
    import tracemalloc

    from ..kernels._threads import one_blas_thread
    from ..lm.checkpoint import save_checkpoint
    from ..lm.training import (AdamConfig, check_text_length, cosine_decay, evaluate, sample_batch, split_heldout,
                               steps_on, trainable_names)
    from ..models import load_model
    from ..stack.transformer import Transformer, check_decoder
    from ..text.ngrams import read_utf8

    for name, value in FINETUNE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.file is None:
        raise ValueError("--from needs FILE, the text to fine-tune on")
    if args.out:
        check_out(args.out, source=args.from_model)
    model, tokenizer = load_model(args.from_model)
    check_decoder(model, "fine-tuning")
    # the checkpoint's arrays are read-only views of its file: train a float32 copy
    model = dataclasses.replace(Transformer.from_params(model.config, {k: np.array(v, np.float32) for k, v in
                                                                       model.params().items()}), name=model.name)
    ids = tokenizer.encode(read_utf8(args.file))
    train, heldout = split_heldout(ids, args.heldout)
    n_ctx = min(args.context, model.config.n_ctx)
    check_text_length(train, n_ctx)
    names = trainable_names(model, args.train_only, last_k=args.last_k)
    rng = np.random.default_rng(args.seed)
    with one_blas_thread():
        before = evaluate(model, heldout, n_ctx=n_ctx) if heldout.size > 1 else None
        steps = steps_on(model, lambda r: sample_batch(train, n_ctx, args.batch, r), steps=args.steps, rng=rng,
                         adam=AdamConfig(lr=args.lr, weight_decay=args.weight_decay, clip=args.clip),
                         schedule=cosine_decay(args.steps) if args.schedule == "cosine" else None, names=names)
        tracemalloc.start()
        t0 = time.perf_counter()
        losses = run_with_progress(steps, 0, args.steps, save=None, save_every=args.steps, quiet=args.json)
        seconds = (time.perf_counter() - t0) / args.steps
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        after = evaluate(model, heldout, n_ctx=n_ctx) if heldout.size > 1 else None
    if args.out:
        save_checkpoint(model, tokenizer, args.out)
    trained = sum(model.params()[n].size for n in names)
    result = {"from": args.from_model, "train_only": args.train_only, "params": model.n_params,
              "trained_params": trained, "steps": args.steps, "batch": args.batch, "context": n_ctx, "lr": args.lr,
              "train_tokens": int(train.size), "heldout_tokens": int(heldout.size), "heldout_before": before,
              "heldout_after": after, "batch_losses": losses, "seconds_per_step": seconds,
              "peak_numpy_bytes_per_step": peak, "out": args.out}
    if args.json:
        print_json(result)
        return 0
    cell = lambda x: "-" if x is None else f"{x:.3f}"   # noqa: E731
    print(f"{args.from_model}: {model.n_params:,} parameters, {trained:,} trained ({args.train_only}); "
          f"{train.size:,} training tokens, {heldout.size:,} held out")
    print(f"held-out loss: before {cell(before)}, after {cell(after)} nats per token ({args.steps} steps of "
          f"{args.batch} × {n_ctx} tokens)")
    print(f"one step: {seconds:.2f} s, peak memory the step allocates (tracemalloc, numpy arrays included) "
          f"{peak / 2**20:,.0f} MiB, on one BLAS thread")
    if args.out:
        print(f"checkpoint: {args.out} (attnlab generate, attend, patch, … read it)")
    return 0


def cmd_train(args) -> int:
    if args.from_model is not None:
        return cmd_finetune(args)
    if args.task == "induction":
        from .induction import cmd_train_induction
        return cmd_train_induction(args)
    for name, value in TEXT_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    from ..lm.resume import load_training_run, save_training_run
    from ..lm.compare import ALPHA, loss_beside_counts
    from ..lm.model import lm_config
    from ..layer.positions import POSITION_SCHEMES
    from ..stack.transformer import Transformer
    from ..kernels._threads import one_blas_thread
    from ..lm.training import AdamConfig, AdamState, check_text_length, cosine_decay, training_steps

    if args.save_every < 1:
        raise ValueError(f"--save-every must be a positive integer, got {args.save_every}")
    if args.resume and not args.out:
        raise ValueError("--resume needs --out DIR, the checkpoint to start from")
    data = load_data(args.file, args.level, args.heldout)
    try:
        positions = POSITION_SCHEMES[args.positions](**({} if args.rope_theta is None else {"theta": args.rope_theta}))
    except TypeError:
        raise ValueError(f"--rope-theta applies to --positions rope only, got --positions {args.positions}") from None
    config = lm_config(data.vocab.size, d_model=args.d_model, n_heads=args.heads, n_kv_heads=args.kv_heads,
                       n_layers=args.layers, n_ctx=args.context, positions=positions,
                       block=args.block)
    check_text_length(data.train, config.n_ctx)
    if args.out:
        if not args.resume:
            Path(args.out).mkdir(parents=True, exist_ok=True)
        check_out(args.out)                                     # a bad --out fails now, not at step 100
    rng, state, start = np.random.default_rng(args.seed), None, 0
    run = {"steps": args.steps, "schedule": args.schedule, "lr": args.lr, "batch": args.batch,
           "weight_decay": args.weight_decay}
    if args.resume:
        model, _, state, rng, extra = load_training_run(args.out, config=config, vocab=data.vocab)
        check_same_run(extra.get("run"), run, args.out)
        start = state.t
        if start >= args.steps:
            raise ValueError(f"the checkpoint in {args.out} has already taken {start} steps; --steps {args.steps} "
                             "counts all steps, so ask for more")
    else:
        model = Transformer.init(config, rng=rng)
        state = AdamState.zeros(model.params())
    adam = AdamConfig(lr=args.lr, weight_decay=args.weight_decay, clip=args.clip)
    schedule = cosine_decay(args.steps) if args.schedule == "cosine" and args.steps > 0 else None
    steps = training_steps(model, data.train, steps=args.steps, batch_size=args.batch, rng=rng, adam=adam,
                           schedule=schedule, state=state, start=start)

    def save():
        save_training_run(args.out, model, data.vocab, state, rng, {"run": run})

    with one_blas_thread():
        losses = run_with_progress(steps, start, args.steps, save=save if args.out else None,
                                   save_every=args.save_every, quiet=args.json)
        figures = loss_beside_counts(model, data.vocab, data.train, data.heldout, max_k=FLOOR_MAX_K,
                                     ks=BASELINE_KS)
    result = {"config": config.to_json(), "params": model.n_params, "steps": args.steps, "batch": args.batch, "lr": args.lr,
              "weight_decay": args.weight_decay, "schedule": args.schedule, "seed": args.seed,
              "train_tokens": int(data.train.size), "heldout_tokens": int(data.heldout.size),
              "last_batch_loss": losses[-1],
              "train_loss": figures["train"]["model"], "heldout_loss": figures.get("heldout", {}).get("model"),
              "floors": {part: f["floors"] for part, f in figures.items()},
              "add_alpha": {part: f["add_alpha"] for part, f in figures.items()}, "alpha": ALPHA,
              "out": args.out}
    note = heldout_note(figures, int(data.train.size))
    result["note"] = note
    if args.json:
        print_json(result)
    else:
        print_table(figures, config)
        from rich.console import Console
        print(batch_loss_line(losses, figures, bar=Console(stderr=True).is_terminal))
        print(f"{model.n_params:,} parameters")
        if note:
            print(note)
        if args.out:
            print(f"checkpoint: {Path(args.out) / 'model.safetensors'}")
    return 0


def check_out(out, *, source=None) -> None:
    """A bad ``--out`` refused before any training: a file, a folder holding other files, a parent this process
    cannot write in, or (fine-tuning) the ``--from`` folder itself, whose files the save would replace. Folders
    that killed saves left beside it are removed."""
    import os

    from .._io import check_folder_target
    from ..lm.checkpoint import FILES

    if source is not None and os.path.exists(source) and os.path.realpath(out) == os.path.realpath(source):
        raise ValueError(f"--out {out} is the --from folder: the save would replace the model it was trained from; "
                         "give --out a new folder")
    check_folder_target(out, owned=FILES)


def check_same_run(saved: dict | None, asked: dict, out) -> None:
    """A resumed run must be the run that was saved: the same optimiser settings and schedule, and under the
    cosine schedule the same ``--steps`` (the schedule's length), or it could not end where that run ends."""
    if saved is None:
        raise ValueError(f"the checkpoint in {out} does not record how it was trained (--steps, --schedule, --lr); "
                         "start a new run")
    differ = [k for k in ("schedule", "lr", "batch", "weight_decay") if saved.get(k) != asked[k]]
    if differ:
        raise ValueError(f"the checkpoint in {out} was trained with other settings: " + "; ".join(
            f"--{k.replace('_', '-')} {saved.get(k)} then, {asked[k]} now" for k in differ) + "; resume with the same")
    if saved["schedule"] == "cosine" and saved.get("steps") != asked["steps"]:
        raise ValueError(f"the checkpoint in {out} follows a cosine schedule laid out over --steps {saved.get('steps')}"
                         f"; --steps {asked['steps']} would change the rate of every step, so the run could not end "
                         f"where an uninterrupted one ends. Resume with --steps {saved.get('steps')}, or train with "
                         "--schedule constant to extend a run")


def run_with_progress(steps, start: int, last: int, *, save, save_every: int, quiet: bool = False) -> list[float]:
    """Drive the training generator (steps ``start + 1 … last``) with a rich progress bar on stderr (loss,
    tokens/s; none with ``quiet``, a command's ``--json``); save every ``save_every`` steps and after the last."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn

    losses, tokens, t0 = [], 0, time.perf_counter()
    columns = (TextColumn("training"), BarColumn(), MofNCompleteColumn(), TextColumn("minibatch loss {task.fields[loss]}"),
               TextColumn("{task.fields[rate]} tokens/s"), TimeRemainingColumn())
    with stderr_progress(*columns, quiet=quiet) as bar:
        task = bar.add_task("train", total=last - start, loss="-", rate="-")
        for s in steps:
            losses.append(s.loss)
            tokens += s.tokens
            rate = tokens / max(time.perf_counter() - t0, 1e-9)
            bar.update(task, advance=1, loss=f"{s.loss:.3f}", rate=f"{rate:,.0f}")
            if save is not None and (s.step % save_every == 0 or s.step == last):
                save()
    return losses


def batch_loss_line(losses: list[float], figures: dict, *, bar: bool = True) -> str:
    """Why the last step's loss and the table's differ: a minibatch against the whole training part. ``bar``:
    the progress bar was drawn (stderr a terminal), so the learner saw that loss there."""
    if not losses:
        return "No step ran (--steps was already reached); the table scores the checkpoint as it is."
    seen = "The progress bar's last loss" if bar else "The last step's loss"
    return (f"{seen}, {losses[-1]:.3f}, is one minibatch's (--batch windows of the last "
            f"step); the table's attention model row, {figures['train']['model']:.3f} on train, scores every "
            "window of the training part after the last step.")


#: how far above its training floor a model's training loss may be and still count as having fit the text
#: (1.25: within a quarter of the floor); further above, the model is undertrained
FIT_MARGIN = 1.25

GUIDE_TEXT = ("the guide's own text is not shipped with attnlab: save the guide as a UTF-8 file, e.g. "
              "attention-guide.txt, and pass its path; docs/lm.md gives what 1,500 steps reach on it")


def heldout_note(figures: dict, n_train: int) -> str | None:
    """A few sentences when the model does worse on the held-out tail than counting with one token of context:
    the training part's figures beside it, and which of the two it is, undertrained (its training loss still
    well above the training floor its context could reach, :data:`FIT_MARGIN`) or overfitting (near that
    floor on the training part, yet worse held-out)."""
    held, train = figures.get("heldout"), figures["train"]
    if not held or held.get("model") is None or 1 not in held["add_alpha"]:
        return None
    model, count = held["model"], held["add_alpha"][1]
    if model <= count:
        return None
    m_train, c_train = train["model"], train["add_alpha"][1]
    k = max(train["floors"])
    floor = train["floors"][k]
    both = (f"though on the training part it does better ({m_train:.3f} against {c_train:.3f})" if m_train < c_train
            else f"and on the training part too ({m_train:.3f} against {c_train:.3f})")
    if m_train > FIT_MARGIN * floor:
        why = (f"It is undertrained, not overfitting: on the training part it is still well above the floor "
               f"counting with k = {k} tokens of context reaches ({floor:.3f}), and {n_train:,} training tokens "
               "are few to learn from. Try more --steps, a longer text (")
    else:
        why = (f"It has fit the training part (near its floor with k = {k}, {floor:.3f}), and that does not carry "
               f"over to the held-out tail: on {n_train:,} training tokens it has memorised the text more than "
               "learned it (overfitting). Try a longer text (")
    return (f"Held-out, the model ({model:.3f}) does worse than add-α counting with k = 1 ({count:.3f}), {both}. "
            f"{why}{GUIDE_TEXT}), or --heldout 0 to watch it approach the training floors.")


def print_table(figures: dict, config) -> None:
    from rich.console import Console

    from ..lm.compare import ALPHA
    from rich.table import Table

    parts = list(figures)
    a = config.attention
    table = Table(title=f"Cross-entropy, nats per token ({config.n_layers} layers × {a.n_heads} heads, "
                        f"d_model {a.d_model}, context {a.n_ctx}, {a.positions.name} positions, "
                        f"{'GPT blocks' if config.d_mlp else 'attention only'})")
    table.add_column("predictor")
    for part in parts:
        table.add_column(part, justify="right")
    cell = lambda x: "-" if x is None else f"{x:.3f}"   # noqa: E731
    label = "attention model" if config.d_mlp is None else "GPT-block model (attention + MLP)"
    table.add_row(label, *(cell(figures[p]["model"]) for p in parts))
    for k in BASELINE_KS:
        table.add_row(f"add-α counts, k = {k} (α = {ALPHA}, fitted on train)",
                      *(cell(figures[p]["add_alpha"][k]) for p in parts))
    for k in figures["train"]["floors"]:
        label = f"floor, k = {k} (counted on that same text)"
        table.add_row(label, *(cell(figures[p]["floors"].get(k)) for p in parts))
    Console().print(table)
    if "heldout" in figures:
        print("A floor counted on the held-out text itself is only an optimistic bound: it knows the held-out "
              "counts, which no predictor fitted on the training part can.")
