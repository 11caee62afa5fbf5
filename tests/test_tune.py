"""attnlab tune and its profile: where it lies, what it records, when it applies, and that every choice follows
it (and the rules without it). Timing is never asserted: the measurements themselves run once, quick."""

import json

import numpy as np
import pytest

from attnlab import attention_path
from attnlab.kernels import _kernels, decode, matmul, profile, quantized, tuning
from attnlab.kernels._kernels import KERNEL_ENV, NO_NUMBA_ENV

CHOICES = {"exp": "exp", "fused_min_scores": {"masked": 1000, "full": None},
           "decode": {"grouped": {"64": "numpy", "512": "fused"}, "ungrouped": {"64": "numpy"}},
           "gemv_order": {"wide": "C", "tall": "F"}, "quantized_threads": 2}


@pytest.fixture
def tune_file(tmp_path, monkeypatch):
    path = tmp_path / "tune.json"
    monkeypatch.setenv(profile.TUNE_FILE_ENV, str(path))
    monkeypatch.delenv(NO_NUMBA_ENV, raising=False)
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    profile.forget()
    yield path
    profile.forget()


def test_the_profile_lies_where_the_environment_says(monkeypatch, tmp_path):
    monkeypatch.setenv(profile.TUNE_FILE_ENV, str(tmp_path / "x.json"))
    assert profile.profile_path() == tmp_path / "x.json"
    monkeypatch.delenv(profile.TUNE_FILE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert profile.profile_path() == tmp_path / "cache" / "attnlab" / "tune.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert profile.profile_path() == tmp_path / "home" / ".cache" / "attnlab" / "tune.json"


def test_no_profile_means_the_rules(tune_file):
    s = profile.status()
    assert s.profile is None and s.reason.startswith(f"no profile at {tune_file}")
    assert _kernels.numpy_exp().reason.startswith("rule")
    assert matmul.gemv_order(tall=True) == "C" and quantized.kernel_threads()["threads"] == 1


def test_a_written_profile_is_atomic_and_records_the_machine(tune_file):
    path = profile.write(CHOICES, {"figures": 1})
    assert path == tune_file and [p.name for p in tune_file.parent.iterdir()] == ["tune.json"]   # no temp left
    data = json.loads(tune_file.read_text())
    assert data["choices"] == CHOICES and data["format"] == profile.FORMAT
    assert data["identity"] == {"cpu": profile.cpu_model(), "simd": profile.simd_level(), "numpy": np.__version__,
                                "numba": profile.numba_version(), "attnlab": profile.attnlab_version()}
    assert profile.status().profile == data


def test_every_choice_follows_the_profile(tune_file, rng):
    profile.write(CHOICES, {})
    assert _kernels.numpy_exp().name == "exp" and _kernels.numpy_exp().reason == "tune profile"
    assert matmul.gemv_order(tall=True) == "F" and matmul.gemv_order() == "C"
    assert quantized.kernel_threads() == {"threads": 2, "reason": "tune profile"}
    assert decode.decode_kernel_rule(10, 3, 100, profile.choice("decode"))[0] == "numpy"
    assert decode.decode_kernel_rule(10, 3, 600, profile.choice("decode"))[0] == "fused"
    if _kernels.numba_installed():
        q = rng.standard_normal((2, 130, 8)).astype(np.float32)               # 33,800 scores: above 1000
        path = attention_path(q, q, q, is_causal=True)
        assert path.kernel == "fused" and "tune profile: fused from 1,000 scores for masked calls" in path.reason
        path = attention_path(q, q, q)
        assert path.kernel == "numpy" and "tune profile" in path.reason
    profile.remove()
    assert not tune_file.exists() and profile.choices() is None


@pytest.mark.parametrize("field, value", [("cpu", "Another CPU"), ("numpy", "1.0.0"), ("attnlab", "0.0.1"),
                                          ("simd", "NEON")])
def test_a_profile_from_another_machine_or_version_is_ignored_with_the_reason(tune_file, field, value):
    profile.write(CHOICES, {})
    data = json.loads(tune_file.read_text())
    data["identity"][field] = value
    tune_file.write_text(json.dumps(data))
    profile.forget()
    s = profile.status()
    assert s.profile is None and f"another {field} {value!r}" in s.reason and "ignored" in s.reason
    assert _kernels.numpy_exp().reason.startswith("rule")


def test_an_unreadable_profile_is_ignored(tune_file):
    tune_file.write_text("{not json")
    assert profile.status().profile is None and "unreadable" in profile.status().reason


def test_the_profile_keeps_where_the_fused_kernel_won_at_every_larger_size():
    rows = [{"scores": s, "masked": True, "fused_ms": f, "numpy_ms": 1.0}
            for s, f in ((100, 0.5), (200, 1.5), (400, 0.9), (800, 0.8))]
    assert tuning.fused_from(rows, True) == 400                # won at 100, lost at 200: from 400 on
    assert tuning.fused_from(rows, False) is None               # no full rows: never
    rows[-1]["fused_ms"] = 2.0
    assert tuning.fused_from(rows, True) is None                # lost at the largest: numpy everywhere
    assert tuning.decode_table([{"kind": "grouped", "n_k": 64, "fused_us": 1, "numpy_us": 2}]) == \
        {"grouped": {"64": "fused"}}


def test_tune_cli_measures_shows_and_resets(tune_file, cli):
    """One quick real run (a few seconds): the profile is written, applies, --show prints it, --reset removes it."""
    out = cli.json("tune", "--quick")
    assert out["applies"] and out["path"] == str(tune_file) and tune_file.is_file()
    choices = out["profile"]["choices"]
    assert choices["exp"] in ("exp", "exp2") and set(choices["gemv_order"]) == {"wide", "tall"}
    assert set(choices["fused_min_scores"]) == {"masked", "full"}
    text = cli.text("tune", "--show")
    assert text.startswith(f"profile {tune_file}") and "numpy's exponential:" in text and "tile kernel," in text
    assert cli.text("tune", "--reset") == f"removed {tune_file}\n" and not tune_file.exists()
    assert cli.text("tune", "--show") == f"no profile at {tune_file} (run `attnlab tune`)\n"
    assert cli.json("tune", "--reset") == {"path": str(tune_file), "removed": False}
    cli.error(["tune", "--show", "--reset"], "not allowed with")
