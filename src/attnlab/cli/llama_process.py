"""llama.cpp in its own process, for the benchmarks and the 8-bit-activation checks: ``llama_cpp``
(llama-cpp-python) is never a dependency and never imported into attnlab's process (its OpenMP runtime and
threads stay out of the timings of attnlab's side).

:class:`LlamaProcess` starts ``python -c CHILD`` with the model file and thread count; each request is a JSON
line on its stdin, each answer a JSON line on its stdout, so a benchmark can alternate rounds between the two
processes. The child measures its own process time (``time.process_time``: its threads' CPU time).

Requests: ``decode`` (rounds of single-token steps after a ``context``-token prompt, rewound after each
step, as :class:`attnlab.cli.bench_harness.Decoder` does), ``fill`` then ``step`` (a cache of ``context`` random
tokens filled once, on the batch threads; then one rewound step a request, for long contexts whose prompt is too
dear to evaluate every round), ``prefill`` (one evaluation of ``tokens`` ids) and
``greedy`` (a prompt and ``steps`` greedy tokens with every position's logits, written to an ``.npy`` file).

The model loads with ggml's extra buffer types off (``use_extra_bufts=False``): no AMX tiles and no repacked
weights, so every product is ``ggml_vec_dot`` with the weight type's ``vec_dot_type``, the arithmetic the
``q8-activations`` mode follows. (On the sandbox's Xeon, whose /proc/cpuinfo lists amx_int8 and amx_tile, a
native llama.cpp build took the AMX path for SmolLM2's Q4_1 products and died on ``tilezero``: SIGILL, the
tiles not enabled for the process.)
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

CHILD = r"""
import json, sys, time
import numpy as np
import llama_cpp

path, threads, n_ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
flash_attn, threads_batch = sys.argv[4] == "1", int(sys.argv[5])
_defaults = llama_cpp.llama_cpp.llama_model_default_params


def model_params():                  # ggml's extra buffer types off: AMX tiles, repacked weights (see above)
    p = _defaults()
    p.use_extra_bufts = False
    return p


llama_cpp.llama_cpp.llama_model_default_params = llama_cpp.llama_model_default_params = model_params
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads_batch, n_batch=512,
                      n_ubatch=512, logits_all=True, flash_attn=flash_attn, verbose=False)
filled = []
print(json.dumps({"ready": True, "version": getattr(llama_cpp, "__version__", "?")}), flush=True)
for line in sys.stdin:
    req = json.loads(line)
    op = req["op"]
    if op == "decode":
        prompt = [1 + i % 1000 for i in range(req["context"])]
        llm.reset()
        llm.eval(prompt)
        times = []
        for _ in range(req["rounds"]):
            t0 = time.process_time()
            for _ in range(req["steps"]):
                llm.n_tokens = len(prompt)
                llm.eval([prompt[-1]])
            times.append((time.process_time() - t0) / req["steps"])
        out = {"seconds": times}
    elif op == "fill":                  # a cache of ``context`` random tokens, kept for the steps below
        llm.reset()
        filled[:] = [int(i) for i in np.random.default_rng(0).integers(3, llm.n_vocab(), req["context"])]
        llm.eval(filled)
        out = {"context": len(filled)}
    elif op == "step":                  # one decode step after the filled cache, rewound: its process seconds
        t0 = time.process_time()
        llm.n_tokens = len(filled)
        llm.eval([filled[-1]])
        out = {"seconds": [time.process_time() - t0]}
    elif op == "prefill":
        ids = [1 + i % 1000 for i in range(req["tokens"])]
        times = []
        for _ in range(req["rounds"]):
            llm.reset()
            t0 = time.process_time()
            llm.eval(ids)
            times.append(time.process_time() - t0)
        out = {"seconds": times}
    elif op == "greedy":
        llm.reset()
        ids = list(req["prompt"])
        llm.eval(ids)
        for _ in range(req["steps"]):
            ids.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([ids[-1]])
        np.save(req["out"], np.asarray(llm.scores[:llm.n_tokens], np.float32))
        out = {"ids": ids}
    else:
        out = {"error": f"unknown op {op!r}"}
    print(json.dumps(out), flush=True)
"""


def llama_cpp_model(path, **options):
    """``llama_cpp.Llama(model_path=path, verbose=False, **options)``, for a process of its own (a benchmark's
    child: never import llama_cpp into attnlab's), with its weights in the CPU's plain
    buffers (llama.cpp's ``use_extra_bufts`` off: no repacking at load), or None when ``llama_cpp`` cannot be
    imported. On the Xeon the figures come from, llama.cpp repacked the Q4_1 weights for AMX by default
    (1.8 s of its load) and then died of SIGILL on its first batch of more than one token; its plain kernels
    run everywhere."""
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as low
    except ImportError:
        return None
    defaults = low.llama_model_default_params

    def plain():
        params = defaults()
        params.use_extra_bufts = False
        return params
    low.llama_model_default_params = plain
    try:
        return llama_cpp.Llama(model_path=str(path), verbose=False, **options)
    finally:
        low.llama_model_default_params = defaults


def llama_cpp_installed() -> bool:
    """Whether ``llama_cpp`` can be imported (looked up, not imported)."""
    return importlib.util.find_spec("llama_cpp") is not None


QUANTIZE = r"""
import ctypes, sys
import llama_cpp
lib = llama_cpp.llama_cpp
params = lib.llama_model_quantize_default_params()
params.ftype = getattr(lib, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
params.allow_requantize = True
params.nthread = 1
sys.exit(lib.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(params)))
"""


def requantize(src, dst, ftype: str) -> None:
    """The GGUF ``src`` requantized by llama.cpp's own ``llama_model_quantize`` to ``dst`` in ``ftype`` (a
    ``LLAMA_FTYPE_MOSTLY_*`` name: "Q5_0", "Q5_1", "Q4_K_M", …; llama.cpp picks each tensor's type, e.g. Q5_0
    for a Q4_K_M tensor whose rows are not a multiple of 256), in a process of its own (a dev reference: the
    8-bit-activation checks' files; llama_cpp is never a dependency)."""
    run = subprocess.run([sys.executable, "-c", QUANTIZE, str(src), str(dst), ftype], capture_output=True,
                         text=True, timeout=1800)
    if run.returncode != 0:
        raise RuntimeError(f"llama_model_quantize to {ftype} failed ({run.returncode}): {run.stderr[-500:]}")


class LlamaProcess:
    """llama.cpp on ``path`` with ``threads`` threads (``threads_batch`` for prompts; default the same) and
    flash-attention on or off, in a child process (a context manager)."""

    def __init__(self, path, threads: int = 1, n_ctx: int = 4096, *, flash_attn: bool = False,
                 threads_batch: int | None = None):
        args = [str(path), str(int(threads)), str(int(n_ctx)), "1" if flash_attn else "0",
                str(int(threads_batch or threads))]
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, *args],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
        hello = self._read()
        self.version = hello.get("version")

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("llama.cpp's process ended without an answer (is llama_cpp importable?)")
        return json.loads(line)

    def request(self, **req) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        out = self._read()
        if "error" in out:
            raise RuntimeError(out["error"])
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=60)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def greedy_logits(model, prompt, steps: int, kv_dtype=None, forced=None):
    """attnlab's greedy decode of ``model`` from ``prompt`` (ids): ``(ids, logits)``, the prompt and ``steps``
    tokens, and every position's logits (prompt + steps, vocab) float32: the prompt in one forward (a prefill),
    then one token at a time against the KV caches (holding ``kv_dtype``; None: the rule's,
    :func:`attnlab.layer.cache.kv_dtype_rule`). ``forced`` (``steps`` ids): feed these tokens instead of the
    argmax (teacher forcing: another decoder's greedy tokens, so both sides see the same contexts)."""
    import numpy as np

    from ..stack.transformer import forward, new_caches

    ids = [int(t) for t in prompt]
    caches = new_caches(model, len(ids) + steps + 1, kv_dtype=kv_dtype)
    rows = [forward(model, np.asarray(ids), caches=caches).logits]            # (P, vocab)
    for s in range(steps):
        ids.append(int(np.argmax(rows[-1][-1])) if forced is None else int(forced[s]))
        rows.append(forward(model, np.asarray(ids[-1:]), caches=caches).logits)   # (1, vocab)
    return ids, np.concatenate(rows).astype(np.float32)


def rel_errors(a, b):
    """Each position's relative error ||a − b|| / ||b|| (rows of logits): an array (positions,)."""
    import numpy as np

    return np.linalg.norm(a - b, axis=-1) / np.linalg.norm(b, axis=-1)


def against_llama_cpp(model, path, prompt, steps: int = 64, tmp=None, kv_dtype=None) -> dict:
    """``model`` (attnlab, e.g. loaded with ``quantized="q8-activations"``) against llama.cpp on the same GGUF
    ``path``: both decode ``steps`` greedy tokens from ``prompt``; llama.cpp runs on 1 thread and on 2 (its own
    run-to-run difference). Returns the tokens of each, whether they are equal, and the relative errors of
    the logits per position (median, max): attnlab against llama.cpp (1 thread) over the positions before
    the first token that differs (the same context on both sides), and llama.cpp 2 threads against 1;
    ``steps_equal`` the greedy steps equal, ``gap_at_split`` llama.cpp's margin between its token and
    attnlab's where they split, over its largest |logit| (None when they never do). ``forced``: attnlab fed
    llama.cpp's greedy tokens (the same context at every step, so one near-tie does not end the comparison):
    ``top1_equal`` the steps whose top-1 token is llama.cpp's, ``rel_err`` over every position. ``kv_dtype``:
    attnlab's caches' (None: the rule's, float16 in the q8 mode as llama.cpp's own)."""
    import tempfile
    from pathlib import Path

    import numpy as np

    tmp = Path(tmp or tempfile.mkdtemp())
    runs = {}
    for threads in (1, 2):
        with LlamaProcess(path, threads=threads, n_ctx=len(prompt) + steps + 8) as llama:
            out = tmp / f"llama_{threads}.npy"
            runs[threads] = (llama.request(op="greedy", prompt=list(map(int, prompt)), steps=steps,
                                           out=str(out))["ids"], np.load(out))
            version = llama.version
    ids, logits = greedy_logits(model, prompt, steps, kv_dtype)
    (ids1, l1), (ids2, l2) = runs[1], runs[2]
    first = next((i for i, (a, b) in enumerate(zip(ids, ids1)) if a != b), len(ids))
    same = slice(0, min(first, len(ids)))            # positions whose contexts are the same on both sides
    ours, theirs = rel_errors(logits[same], l1[same]), rel_errors(l2, l1)
    gap = None
    if first < len(ids):                              # llama.cpp's margin between the two tokens at the split
        row = l1[first - 1]
        gap = float(row[ids1[first]] - row[ids[first]]) / float(np.abs(row).max())
    p = len(prompt)
    _, forced = greedy_logits(model, prompt, steps, kv_dtype, forced=ids1[p:])   # (P + steps, vocab)
    forced_err = rel_errors(forced, l1)                                          # (P + steps,)
    return {"llama_cpp": version, "steps": steps, "prompt_tokens": len(prompt),
            "forced": {"top1_equal": int(np.sum(forced[p - 1:-1].argmax(-1) == np.asarray(ids1[p:]))),
                       "rel_err": {"median": float(np.median(forced_err)), "max": float(forced_err.max())}},
            "tokens_equal": ids == ids1, "steps_equal": max(0, first - len(prompt)), "gap_at_split": gap,
            "llama_threads_tokens_equal": ids2 == ids1,
            "rel_err": {"median": float(np.median(ours)), "max": float(ours.max())},
            "llama_run_to_run": {"median": float(np.median(theirs)), "max": float(theirs.max())},
            "top1_agree": float(np.mean(logits[same].argmax(-1) == l1[same].argmax(-1)))}


def llama_step(path, context: int, *, threads: int = 1, flash_attn: bool = False, fill_threads: int | None = None):
    """``(process, step)``: llama.cpp in its own process with its cache filled by ``context`` random tokens (on
    ``fill_threads``), and ``step()``, one rewound decode step returning the child's process seconds (pair it with
    :func:`attnlab.cli.bench_harness.reported`); None when ``llama_cpp`` is not installed. Close the process."""
    if not llama_cpp_installed():
        return None
    llama = LlamaProcess(path, threads=threads, n_ctx=context + 8, flash_attn=flash_attn,
                         threads_batch=fill_threads or threads)
    llama.request(op="fill", context=context)
    return llama, lambda: llama.request(op="step")["seconds"][0]
