"""Wall time of `attnlab tour`, as a learner runs it: the issue's bound is 30 s.

    PYTHONPATH=src python benchmarks/tour_time.py [--repeats 3] [--out DIR]

1. The whole command in a fresh process (imports, MiniLM's load, every figure, index.html), --repeats
   times: wall seconds and the CPU seconds the process used (user + system), median and range.
2. One run in this process, section by section: wall and CPU seconds of each.

Wall time counts waiting for a core; the CPU seconds do not. On a shared machine the load average
(printed before and after) says how much of the wall time was waiting: on an idle machine wall ≈ CPU.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from attnlab.cli.bench_harness import cpu_model  # noqa: E402

BOUND_S = 30.0


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def whole_command(out: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of `python -m attnlab tour --out OUT` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    cpu0, t0 = children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, "-m", "attnlab", "tour", "--out", str(out)], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, children_cpu() - cpu0


def by_section(out: Path) -> list[tuple[str, float, float]]:
    """(section id, wall, CPU) seconds of each section, run in this process."""
    from attnlab.cli import tour
    rows, last = [], [time.perf_counter(), time.process_time()]

    def on_section(i, total, s):
        now = [time.perf_counter(), time.process_time()]
        rows.append((s.id or str(i + 1), now[0] - last[0], now[1] - last[1]))
        last[:] = now
    tour.run_tour(out, on_section=on_section)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", help="folder for the tour (default: a temporary one)")
    args = p.parse_args()
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; load average before {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out or tmp)
        runs = [whole_command(out / f"run{i}") for i in range(args.repeats)]
        walls, cpus = [w for w, _ in runs], [c for _, c in runs]
        print(f"attnlab tour, {args.repeats} fresh processes: wall median {statistics.median(walls):.1f} s "
              f"({min(walls):.1f} … {max(walls):.1f}), CPU median {statistics.median(cpus):.1f} s "
              f"({min(cpus):.1f} … {max(cpus):.1f}); bound {BOUND_S:.0f} s: "
              f"{'met' if statistics.median(walls) < BOUND_S else 'MISSED'}")
        rows = by_section(out / "sections")
    print(f"{'section':<10} {'wall s':>7} {'CPU s':>6}")
    for sid, wall, cpu in rows:
        print(f"{sid:<10} {wall:7.2f} {cpu:6.2f}")
    print(f"{'all':<10} {sum(r[1] for r in rows):7.2f} {sum(r[2] for r in rows):6.2f}  (after imports)")
    print(f"load average after {os.getloadavg()} (above {os.cpu_count()}: other processes were waiting for "
          "the cores, and the wall times above include that wait)")


if __name__ == "__main__":
    main()
