"""The start of a script that calls llama.cpp's own CPU functions (libggml-cpu, from llama-cpp-python's
``lib`` folder) through ctypes, in a process of its own, on the inputs a test saved: the dev-only references of
tests/test_q8_q5.py and tests/test_q8k_activations.py. It defines ``cpu`` (the library), ``raw``, ``x``,
``qtype``, ``N`` and ``d_in`` from the ``.npz`` named by the script's first argument."""

PROLOGUE = r"""
import ctypes, importlib.util, os, sys
import numpy as np
lib = os.path.join(os.path.dirname(importlib.util.find_spec("llama_cpp").origin), "lib", "libggml-cpu.so")
cpu = ctypes.CDLL(lib)
cpu.ggml_cpu_init()
data = np.load(sys.argv[1])
raw, x, qtype = np.ascontiguousarray(data["raw"]), np.ascontiguousarray(data["x"], np.float32), str(data["qtype"])
N, d_in = x.shape
"""
