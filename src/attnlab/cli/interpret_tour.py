"""The tour's last section, "What trained heads do": MiniLM's heads ranked by the detectors, and the shipped
induction model's two heads on a repeated sequence."""

from __future__ import annotations

import numpy as np

SENTENCE = "The cat sat on the mat because the cat was tired, and the mat was warm."


INDUCTION_LEVEL = 0.5     # an induction score above which a head counts as an induction head here


def induction_heads_line(scores: np.ndarray, layer: int) -> str:
    """Every head of ``layer`` with its induction score, and how many pass :data:`INDUCTION_LEVEL`."""
    heads = ", ".join(f"head {h} {v:.3f}" for h, v in enumerate(scores))
    n = int((scores > INDUCTION_LEVEL).sum())
    return (f"layer {layer}'s induction scores: {heads}: {n} induction head{'s' * (n != 1)} (score above "
            f"{INDUCTION_LEVEL}), as `attnlab detect --model induction --repeat-random 6 --exclude-bos` finds")


def induction_heads_prose(scores: np.ndarray, layer: int) -> str:
    """One sentence saying how many induction heads the layer grew."""
    strong = [h for h, v in enumerate(scores) if v > INDUCTION_LEVEL]
    if len(strong) < 2:
        return "It is the layer's only induction head."
    names = " and ".join(f"head {h} ({scores[h]:.3f})" for h in strong)
    return (f"In fact layer {layer} grew {len(strong)} of them, {names}, doing the same job side by side; the "
            "figure shows the first.")


def what_heads_do(ctx, Section, Figure):
    from ..interpret import detect_heads, top_heads
    from ..interpret.figures import save_head_grids, save_two_heads
    from ..interpret.induction import FIRST, REPEAT, eval_batch, induction_batch, offset_baseline, per_token_loss
    from ..interpret.trained import INDUCTION_COMMAND, INDUCTION_CONFIG, load_induction_model
    from ..stack.transformer import forward
    from ..viz import terminal_text
    from ..viz.attnmap import AttentionMap

    lines, data, figures = [], {}, []
    try:
        model, tok = ctx.minilm()
        ids = tok.encode(SENTENCE)
        scores = detect_heads(model, ids)
        data["minilm"] = {"sentence": SENTENCE, "scores": scores,
                          "top": {k: top_heads(v, 3) for k, v in scores.items()}}
        lines.append(f"all-MiniLM-L6-v2 on {SENTENCE!r}, the top three heads of each detector:")
        for k, v in scores.items():
            lines.append(f"  {k:>16}: " + ", ".join(f"L{i}H{j} {s:.3f}" for i, j, s in top_heads(v, 3)))
        save_head_grids(ctx.out / "detectors_minilm.png", {k.replace("_", " "): v for k, v in scores.items()},
                        title="all-MiniLM-L6-v2: detector scores")
        figures.append(Figure("detectors_minilm.png", "every MiniLM head's previous-token, duplicate-token and "
                                                      "induction score"))
    except FileNotFoundError as e:                 # MiniLM's package is not installed: say so, go on
        lines.append(f"(MiniLM skipped: {e})")
    cfg = INDUCTION_CONFIG
    small = load_induction_model()
    ids, targets, kind = held_out = eval_batch(cfg)                                # (64, n_ctx) each
    loss = per_token_loss(forward(small, ids).logits, targets)                    # (64, n_ctx)
    first, repeat = float(loss[kind == FIRST].mean()), float(loss[kind == REPEAT].mean())
    seq = induction_batch(cfg.task, 1, np.random.default_rng(7))[0][0]            # (n_ctx,)
    labels = cfg.task.vocab().labels(seq)
    weights = forward(small, seq, return_weights=True).attentions
    s = detect_heads(small, seq, ("previous_token", "induction"), exclude_bos=True)
    h0, h1 = int(np.argmax(s["previous_token"][0])), int(np.argmax(s["induction"][1]))
    b = {"previous_token": (0, h0, float(s["previous_token"][0, h0])),
         "induction": (1, h1, float(s["induction"][1, h1]))}
    save_two_heads(ctx.out / "induction_heads.png", weights, labels,
                   [(*b["previous_token"][:2], "previous token"), (*b["induction"][:2], "induction")])
    figures.append(Figure("induction_heads.png", "the small induction model's two heads on a repeated sequence"))
    (l0, h0, s0), (l1, h1, s1) = b["previous_token"], b["induction"]
    amap = AttentionMap(labels, np.stack(weights), keep=np.tril(np.ones((len(seq), len(seq)), bool)))
    guess = offset_baseline(held_out, cfg.task)
    lines += ["", f"A 2-layer attention-only model trained on random tokens whose segment repeats "
              f"({INDUCTION_COMMAND}), on {''.join(labels)!r}:",
              f"layer {l0}, head {h0}: previous-token score {s0:.3f} on it", terminal_text(amap, l0, h0),
              f"layer {l1}, head {h1}: induction score {s1:.3f} on it", terminal_text(amap, l1, h1),
              induction_heads_line(s["induction"][1], l1),
              f"On {len(ids)} held-out sequences: loss on first occurrences {first:.3f} nats (log V = "
              f"{np.log(cfg.task.vocab_size):.3f}), on repeats {repeat:.3f}; one layer, guessing by offset, can do "
              f"no better than {guess:.3f}."]
    data["induction"] = {"first_loss": first, "repeat_loss": repeat, "offset_baseline": guess,
                         "previous_token": s["previous_token"], "induction": s["induction"], "tokens": list(labels),
                         "heads": b}
    return Section("What trained heads do", "\n".join(lines), data, tuple(figures), id="interpret", prose=(
        "Detectors score a head by the share of its weight that falls where a pattern says: one token back "
        "(previous token), an earlier copy of the same token (duplicate token), or the token right after an "
        "earlier copy (induction). MiniLM has one head in its first layer that looks almost only one token back.",
        f"The small model learned to continue a repeated sequence. Layer {l0}, head {h0} looks one token back, "
        f"so every position also carries the token before it; layer {l1}, head {h1} then looks for the position "
        "whose previous token is the current token, and copies what sits there: an induction head (Olsson et "
        f"al., 2022). {induction_heads_prose(s['induction'][1], l1)} Its loss on repeats fell suddenly during "
        "training, a phase change.",
        "One layer cannot build this: no head in the first layer knows what came before a key. Trained alike, a "
        "1-layer model only learns to guess among the tokens a segment's length back, which fails on a period "
        f"it never saw. `{INDUCTION_COMMAND}` trains the model shown here again (about a minute; add "
        "`--layers 1` for the control), and `--model induction` names it in every command below."),
        commands=(f"attnlab detect '{SENTENCE}' --png detectors.png",
                  "attnlab detect --model induction --repeat-random 6 --exclude-bos",
                  "attnlab ablate '|abcdefgabcdefg' --model induction",
                  "attnlab patch --model induction --clean '|abcdefgabcde' --corrupt '|abcdzfgabcde' --answer f "
                  "--wrong g",
                  "attnlab lens '|abcdefgabcde' --model induction --top 2",
                  "attnlab scan MY_TEXT.txt --workers 0 --out scan"))
