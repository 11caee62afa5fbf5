"""The CPU-feature rules follow the target, not the hardware (issue 33: every goal on AVX2 and on AVX-512 machines).

- The 8-bit kernels' instructions (:func:`attnlab.kernels._kernels.vnni_rules`) follow the features numba compiles
  for (:func:`~attnlab.kernels._kernels.numba_target_features`): with ``NUMBA_CPU_FEATURES`` set to Haswell's, as
  ``benchmarks/avx2_emulated.py`` sets it, the AVX2 branch (``vpmaddwd``), whatever the CPU underneath has.
- numpy's exponential (:func:`~attnlab.kernels._kernels.exp_rule`) and the SIMD level the bench and the tune
  profile print follow numpy's dispatch, which ``NPY_DISABLE_CPU_FEATURES`` turns down to AVX2.

numpy only: the rules are pure functions of feature strings; numba's own compile for Haswell, bit for bit, is
tests/test_q8_activations.py's.
"""

import os
import platform
import subprocess
import sys

import pytest

from attnlab.kernels import _kernels, profile

# what LLVM reports on a Sapphire Rapids Xeon (a part of it), and the features the AVX2 emulation hands numba
SAPPHIRE_RAPIDS = "+avx,+avx2,+fma,+f16c,+avx512f,+avx512bw,+avx512vl,+avx512vnni,+avxvnni,+amx-int8"
HASWELL = "+avx2,+fma,+f16c,+bmi2"
ALDER_LAKE = "+avx2,+fma,+f16c,+avxvnni,-avx512f,-avx512vnni,-avx512vl"


def host_must_not_be_read():
    raise AssertionError("numba targets the configured features: the host's must not be read")


def test_numba_targeting_haswell_takes_the_avx2_branch_on_an_avx512_host():
    features = _kernels.numba_target_features(HASWELL, host_must_not_be_read)
    assert features == {"avx2": True, "fma": True, "f16c": True, "bmi2": True}
    assert _kernels.vnni_rules(features) == (False, False)                     # vpmaddwd, no zmm


def test_without_a_configured_target_the_rules_follow_the_host():
    assert _kernels.vnni_rules(_kernels.numba_target_features(None, lambda: SAPPHIRE_RAPIDS)) == (True, True)
    assert _kernels.vnni_rules(_kernels.numba_target_features(None, lambda: ALDER_LAKE)) == (True, False)
    # NUMBA_ENABLE_AVX=0: numba turns every avx* feature off in what it hands LLVM
    off = SAPPHIRE_RAPIDS.replace("+avx", "-avx")
    assert _kernels.vnni_rules(_kernels.numba_target_features(None, lambda: off)) == (False, False)


def test_vnni_rules_by_hand():
    rules = _kernels.vnni_rules
    assert rules({}) == (False, False)
    assert rules({"avxvnni": True}) == (True, False)                           # two 256-bit vpdpbusd
    assert rules({"avx512vnni": True, "avx512vl": True}) == (True, True)       # one 512-bit
    assert rules({"avx512vnni": True, "avx512vl": False}) == (False, False)    # no 256-bit form without VL
    assert rules({"avxvnni": False, "avx512vnni": False, "avx512vl": True}) == (False, False)


def test_the_feature_string_parses_plus_and_minus_and_ignores_blanks():
    got = _kernels.numba_target_features("+avx2,-avx512f,,+fma", host_must_not_be_read)
    assert got == {"avx2": True, "avx512f": False, "fma": True}
    assert _kernels.numba_target_features("", host_must_not_be_read) == {}


def test_numpy_rules_under_the_emulations_numpy_features():
    """numpy 2.x with NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR" still lists AVX512F and its
    like as found, but its AVX-512 dispatch groups (X86_V4, AVX512_SKX, ...) off: the rules must read those."""
    emulated = {"SSE42", "AVX", "F16C", "FMA3", "AVX2", "X86_V3", "AVX512F", "AVX512CD", "AVX512VL", "AVX512BW",
                "AVX512DQ", "AVX512VNNI", "AVX512_CLX", "AVX512_CNL"}
    assert _kernels.exp_rule(emulated)[0] == "exp"
    assert profile.simd_level(emulated) == "AVX2"
    assert profile.simd_level(emulated | {"AVX512_SKX"}) == "AVX-512"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 numpy dispatch")
def test_npy_disable_cpu_features_turns_numpys_rules_to_avx2():
    from numpy._core import _multiarray_umath as umath

    if "X86_V4" not in umath.__cpu_dispatch__ or not umath.__cpu_features__.get("AVX512_SKX"):
        pytest.skip("this numpy or CPU has no AVX-512 dispatch to turn off")
    code = ("from attnlab.kernels import _kernels, profile; "
            "print(profile.simd_level(), _kernels.exp_rule(profile.cpu_features())[0])")
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES="X86_V4 AVX512_ICL AVX512_SPR")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["AVX2", "exp"]
