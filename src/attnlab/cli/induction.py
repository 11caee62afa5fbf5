"""attnlab train --task induction: grow an induction head from scratch and watch the phase change."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._app import print_json, stderr_progress

# what `attnlab train --task induction` uses when an option is not given (see InductionConfig for why)
INDUCTION_DEFAULTS = {"steps": 1000, "context": 24, "heads": 2, "positions": "rope", "batch": 32, "lr": 1e-2}


def induction_config(args):
    from ..interpret.induction import InductionConfig, InductionTask
    for name, value in INDUCTION_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.file is not None:
        raise ValueError("--task induction trains on random tokens; it takes no FILE")
    task = InductionTask(n_ctx=args.context)
    return InductionConfig(task=task, n_layers=args.layers, n_heads=args.heads, d_model=args.d_model,
                           steps=args.steps, batch_size=args.batch, lr=args.lr, positions=args.positions,
                           seed=args.seed)


def cmd_train_induction(args) -> int:
    from ..kernels._threads import one_blas_thread
    from ..interpret.induction import load_run, save_run, start_run, train_steps
    config = induction_config(args)
    if args.resume and not args.out:
        raise ValueError("--resume needs --out DIR, the run to go on with")
    if args.out and not args.resume:
        Path(args.out).mkdir(parents=True, exist_ok=True)
    run = load_run(config, args.out) if args.resume else start_run(config)
    if run.step >= config.steps:
        raise ValueError(f"the run in {args.out} has already taken {run.step} steps; --steps counts all steps")
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    columns = (TextColumn("induction"), BarColumn(), MofNCompleteColumn(),
               TextColumn("repeat loss {task.fields[loss]}"), TimeRemainingColumn())
    with one_blas_thread(), stderr_progress(*columns, quiet=args.json) as bar:
        task = bar.add_task("train", total=config.steps, completed=run.step, loss="-")
        for step in train_steps(run):
            bar.update(task, completed=step, loss=f"{run.final.repeat_loss:.3f}")
            if args.out and (step % args.save_every == 0 or step == config.steps):
                save_run(run, args.out)
    result = induction_result(run)
    if args.out:
        result["figures"] = induction_figures(run, args.out)
        result["out"] = args.out
    if args.json:
        print_json(result)
        return 0
    print(format_induction(result))
    return 0


def induction_result(run) -> dict:
    from ..interpret.induction import (best_heads, copy_baseline, eval_batch, first_and_repeat_loss, off_range_batch,
                                       offset_baseline)
    e, c = run.final, run.config
    off = off_range_batch(c.task, 64, np.random.default_rng([c.seed, 2]))
    off_first, off_repeat = first_and_repeat_loss(run.model, off)
    held_out = eval_batch(c)
    log_v = float(np.log(c.task.vocab_size))
    return {"task": "induction", "layers": c.n_layers, "heads": c.n_heads, "d_model": c.d_model,
            "positions": c.positions, "steps": run.step, "seed": c.seed, "vocab_size": c.task.vocab_size,
            "n_ctx": c.task.n_ctx, "periods": [c.task.min_period, c.task.max_period], "log_v": log_v,
            "first_loss": e.first_loss, "repeat_loss": e.repeat_loss, "repeat_over_log_v": e.repeat_loss / log_v,
            "copy_baseline": copy_baseline(held_out), "offset_baseline": offset_baseline(held_out, c.task),
            "off_range": {"period": int(off[0].shape[1] // 2), "first_loss": off_first, "repeat_loss": off_repeat,
                          "repeat_over_log_v": off_repeat / log_v},
            "previous_token_scores": e.previous_token, "induction_scores": e.induction,
            "duplicate_token_scores": e.duplicate_token, "phase_change_step": run.phase_change_step(),
            "best_heads": best_heads(e), "seconds": run.seconds,
            "curve": {"step": [h.step for h in run.history], "first_loss": [h.first_loss for h in run.history],
                      "repeat_loss": [h.repeat_loss for h in run.history]}}


def induction_figures(run, out) -> list[str]:
    from ..interpret.figures import save_induction_curves, save_two_heads
    from ..interpret.induction import best_heads, induction_batch
    from ..stack.transformer import forward
    curves, heads = Path(out) / "induction_curves.png", Path(out) / "induction_heads.png"
    save_induction_curves(curves, run)
    ids = induction_batch(run.config.task, 1, np.random.default_rng(7))[0][0]     # (n_ctx,) one sequence
    weights = forward(run.model, ids, return_weights=True).attentions
    b = best_heads(run.final)
    save_two_heads(heads, weights, run.config.task.vocab().labels(ids),
                   [(*b["previous_token"][:2], "previous token"), (*b["induction"][:2], "induction")])
    return [str(curves), str(heads)]


def format_induction(r: dict) -> str:
    lines = [f"{r['layers']}-layer attention-only model, {r['heads']} heads of width {r['d_model'] // r['heads']}, "
             f"{r['positions']} positions, trained {r['steps']} steps in {r['seconds']:.1f} s on sequences of "
             f"{r['vocab_size']} random tokens whose segment (length {r['periods'][0]}–{r['periods'][1]}) repeats",
             "", " step  first  repeat"]
    cv = r["curve"]
    for i in np.unique(np.linspace(0, len(cv["step"]) - 1, 11).astype(int)):
        lines.append(f"{cv['step'][i]:>5}  {cv['first_loss'][i]:.3f}  {cv['repeat_loss'][i]:.3f}")
    phase, off = r["phase_change_step"], r["off_range"]
    lines += ["", f"loss on first occurrences {r['first_loss']:.3f} nats (log V = {r['log_v']:.3f}); on repeats "
              f"{r['repeat_loss']:.3f} ({r['repeat_over_log_v']:.2f} · log V)",
              "without induction, on repeats: copying any earlier token of the context gives "
              f"{r['copy_baseline']:.3f}, "
              f"copying one of the tokens {r['periods'][0] - 1}–{r['periods'][1] - 1} positions back (the range of "
              f"periods) {r['offset_baseline']:.3f}",
              f"on a period never trained on ({off['period']}, the standard test: BOS, N tokens, the same N), "
              f"loss on repeats {off['repeat_loss']:.3f} ({off['repeat_over_log_v']:.2f} · log V): induction carries "
              "over, a guess by offset does not",
              "phase change: " + (f"the repeat loss falls below half the offset guess at step {phase}"
                                  if phase is not None else "none (the repeat loss never fell below half the "
                                  "offset guess: no induction)")]
    pt, ind = r["best_heads"]["previous_token"], r["best_heads"]["induction"]
    lines.append(f"best previous-token head in layer 0: L{pt[0]}H{pt[1]} {pt[2]:.3f}; best induction head in the "
                 f"last layer: L{ind[0]}H{ind[1]} {ind[2]:.3f}")
    for name in ("previous_token_scores", "induction_scores"):
        lines.append(f"{name.replace('_', ' ')}: " + "; ".join(
            f"layer {i}: " + " ".join(f"{v:.2f}" for v in row) for i, row in enumerate(r[name])))
    for f in r.get("figures", []):
        lines.append(f"wrote {f}")
    if r.get("out"):
        lines.append(checkpoint_line(r["out"]))
    return "\n".join(lines)


def checkpoint_line(out: str) -> str:
    """Where the checkpoint went, and two commands to try on it, with the BOS its sequences start with."""
    return (f"checkpoint: {out} (attnlab detect --model {out} --repeat-random 6; attnlab lens '|abcdefabcdef' "
            f"--model {out}: its sequences start with '|', the BOS it was trained with)")
