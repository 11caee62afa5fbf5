"""numba's cached kernels loaded without its compiler's set-up (attnlab.kernels._numba_load): the same machine
code, so the same bits as numba's own way, in a fresh process; anything the cache does not hold goes numba's way."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

numba = pytest.importorskip("numba")

SRC = Path(__file__).resolve().parents[1] / "src"

# one exact product of each fused kernel (Q4_1 and Q8_0), a row of a quantized table, and the q8 mode's product,
# in a fresh process; prints the outputs' bytes and whether numba set up its compiler
PRODUCTS = r'''
import sys
import numpy as np
from attnlab.kernels import _numba_load
if sys.argv[1] == "numba's way":
    _numba_load.from_cache = lambda kernel, args: False
from attnlab.kernels.q8_activations import Q8ActivationMatrix
from attnlab.kernels.quantized import QuantizedMatrix
rng = np.random.default_rng(0)
outs = []
for cls, qtype, nbytes in ((QuantizedMatrix, "Q4_1", 20), (QuantizedMatrix, "Q8_0", 34),
                           (Q8ActivationMatrix, "Q4_1", 20)):
    raw = rng.integers(0, 256, (12, 2 * nbytes), dtype=np.uint8)                # 12 rows of 2 blocks
    halves = raw.reshape(12, 2, nbytes)[..., :4 if qtype == "Q4_1" else 2].view(np.float16)
    halves[...] = rng.uniform(-0.1, 0.1, halves.shape).astype(np.float16)      # finite scales and minima
    w = cls(raw, qtype, 64)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    outs += [x @ w, w.T[np.array([3, 7])]]
from attnlab.kernels._kernels import step_module
rows = rng.standard_normal((3, 64)).astype(np.float32)
normed = np.empty_like(rows)
step_module().rms_norm_rows(rows, np.ones(64, np.float32), np.float32(1 / 64), np.float32(1e-5), normed)
outs.append(normed)                                                             # a decode step's fused norm
from numba.core.imputils import builtin_registry
from numba.core.registry import cpu_target
print(b"".join(o.tobytes() for o in outs).hex(), builtin_registry in cpu_target.target_context._registries)
'''


def products(way: str) -> tuple[str, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]))
    env.pop("ATTNLAB_NO_NUMBA", None)
    run = subprocess.run([sys.executable, "-c", PRODUCTS, way], env=env, capture_output=True, text=True,
                         timeout=600, check=True)
    out, set_up = run.stdout.split()
    return out, set_up


def test_the_kernels_from_the_cache_are_numba_s_bit_for_bit_without_its_set_up():
    products("numba's way")                            # compiles into numba's cache if it does not hold them yet
    ours, ours_set_up = products("from the cache")
    theirs, theirs_set_up = products("numba's way")
    assert ours == theirs
    assert (ours_set_up, theirs_set_up) == ("False", "True")


def test_a_kernel_without_a_cache_goes_numba_s_way():
    from attnlab.kernels._numba_load import call, from_cache

    @numba.njit                                       # no cache=True: nothing to load
    def twice(x):
        return 2.0 * x

    assert from_cache(twice, (1.5,)) is False
    assert call(twice, 1.5) == 3.0
    assert from_cache(twice, (1.5,)) is True          # compiled now: held by the dispatcher
    np.testing.assert_array_equal(call(twice, np.arange(3.0)), [0.0, 2.0, 4.0])   # another type: numba compiles it


def test_a_module_s_kernels_from_the_cache_then_the_kernel_itself():
    from attnlab.kernels import _step_fused
    from attnlab.kernels._numba_load import FromCache

    loaded = FromCache(_step_fused)
    x = np.array([[3.0, 4.0]], np.float32)                                      # by hand: rms of (3, 4) is √12.5
    out = np.empty_like(x)
    loaded.rms_norm_rows(x, np.ones(2, np.float32), np.float32(0.5), np.float32(0.0), out)
    np.testing.assert_allclose(out, [[3 / 12.5 ** 0.5, 4 / 12.5 ** 0.5]], rtol=1e-6)
    assert loaded.rms_norm_rows is _step_fused.rms_norm_rows                    # after its first call: the kernel
