"""attnlab scan FILE: per-head statistics over a corpus, on Dask workers (Clark et al., 2019)."""

from __future__ import annotations

import time
from pathlib import Path

from ._app import add_command, add_json_flag, print_json, stderr_progress
from ._model import add_model_option, model_arg, open_source


def add_scan(sub) -> None:
    p = add_command(sub, "scan", help="average every head's entropy, distance, [CLS]/[SEP]/punctuation weight "
                    "and detector scores over every line of a corpus", beyond="docs/interpret.md",
                    shows="Shows every head's average entropy, distance, weight on [CLS], [SEP] and punctuation "
                          "and detector scores over every line of a text file (MY_TEXT.txt: any UTF-8 file)",
                    examples=("attnlab scan MY_TEXT.txt --workers 0", "attnlab scan MY_TEXT.txt --out scan"))
    p.add_argument("file", metavar="FILE", help="UTF-8 text, one sentence or line per document")
    add_model_option(p, default="minilm")
    p.add_argument("--scheduler", metavar="ADDR", help="a Dask scheduler (tcp://host:8786); default: a "
                   "LocalCluster of worker processes on this machine")
    p.add_argument("--timeout", type=float, default=10.0, metavar="SECONDS",
                   help="seconds to wait for the --scheduler to answer (default 10)")
    p.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes (default 2); "
                   "0 = no Dask, scan in this process")
    p.add_argument("--chunk", type=int, default=16, help="lines per task (default 16)")
    p.add_argument("--out", metavar="DIR", help="write a layer × head heatmap per statistic here")
    add_json_flag(p)
    p.set_defaults(func=cmd_scan)


def cmd_scan(args) -> int:
    from ..interpret.scan import read_corpus_lines, scan_corpus
    if args.workers < 0:
        raise ValueError(f"--workers must be >= 0, got {args.workers}")
    if args.chunk < 1:
        raise ValueError(f"--chunk must be a positive integer, got {args.chunk}")
    if not 0 < args.timeout < float("inf"):
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    lines, skipped = read_corpus_lines(args.file)
    open_source(args)                                           # an unknown --model fails now, not in a worker
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)       # an unwritable --out fails now
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
    t0 = time.perf_counter()
    with _client(args) as client, stderr_progress(TextColumn("scanning"), BarColumn(), MofNCompleteColumn(),
                                                  TimeRemainingColumn(), quiet=args.json) as bar:
        task = bar.add_task("scan", total=len(lines))
        sums = scan_corpus(model_arg(args), lines, client=client, chunk_size=args.chunk, quantized=args.quantized,
                           on_progress=lambda done, total: bar.update(task, completed=done))
    seconds = time.perf_counter() - t0
    means = sums.means()
    absent = absent_tokens(means)                               # ["cls", "sep"] for a model without them
    figures = write_figures(args.out, means, model_arg(args), leave_out=absent) if args.out else []
    where = "this process" if args.workers == 0 and not args.scheduler else \
        (args.scheduler or f"a LocalCluster of {args.workers} worker processes")
    result = {"model": model_arg(args), "file": str(args.file), "lines": sums.lines, "tokens": sums.tokens,
              "skipped_too_long": sums.too_long, "skipped_one_token": sums.too_short,
              "skipped_lines": {kind: {"count": len(numbers), "line_numbers": numbers}
                                for kind, numbers in skipped.items()}, "seconds": seconds,
              "lines_per_second": sums.lines / seconds, "ran_on": where, "means": means, "figures": figures,
              "absent_tokens": absent}
    if args.json:
        print_json(result)
        return 0
    print(f"{model_arg(args)}: {sums.lines} lines ({sums.tokens} tokens) in {seconds:.1f} s on {where}, "
          f"{sums.lines / seconds:.1f} lines/s")
    if any(skipped.values()):
        print("skipped " + ", ".join(f"{len(n)} {kind.replace('_', '-')} line{'s' * (len(n) != 1)} "
                                     f"(line {', '.join(map(str, n[:5]))}{', …' * (len(n) > 5)})"
                                     for kind, n in skipped.items() if n))
    if sums.too_long or sums.too_short:
        print(f"skipped {sums.too_long} lines longer than the model's positions and {sums.too_short} of one token")
    if absent:
        print(f"no {' or '.join(SPECIAL[k] for k in absent)} token in any line ({model_arg(args)} has "
              f"{'neither' if len(absent) == 2 else 'none'}): {', '.join(absent)} left out")
    from ..interpret import top_heads
    for k, m in means.items():
        if k in absent:
            continue
        best = ", ".join(f"L{i}H{j} {v:.3f}" for i, j, v in top_heads(m, 3))
        print(f"{k:>16}: highest {best}")
    for f in figures:
        print(f"wrote {f}")
    return 0


class _client:
    """The Dask client the scan runs on (None for --workers 0), closed afterwards with its LocalCluster."""

    def __init__(self, args):
        self.args, self.cluster, self.client = args, None, None

    def __enter__(self):
        from ..distributed.cluster import connect
        from ..interpret.scan import scan_cluster
        if self.args.scheduler:
            self.client = connect(self.args.scheduler, timeout=self.args.timeout)
        elif self.args.workers > 0:
            self.cluster, self.client = scan_cluster(self.args.workers)
        return self.client

    def __exit__(self, *exc):
        for thing in (self.client, self.cluster):
            if thing is not None:
                thing.close()


SPECIAL = {"cls": "[CLS]", "sep": "[SEP]"}


def absent_tokens(means: dict) -> list[str]:
    """The special-token statistics ("cls", "sep") that are 0 in every head: no line held that token (a head
    attending to a token gives it a weight above 0), as in a model without it (SmolLM2, GPT-2)."""
    return [k for k in SPECIAL if not means[k].any()]


def write_figures(out, means: dict, model: str, *, leave_out=()) -> list[str]:
    from ..interpret.figures import save_head_grids
    groups = {"scan_attention.png": ("entropy", "distance"), "scan_special.png": ("cls", "sep", "punctuation"),
              "scan_detectors.png": ("previous_token", "duplicate_token", "induction")}
    paths = []
    for name, keys in groups.items():
        path = Path(out) / name
        save_head_grids(path, {k.replace("_", " "): means[k] for k in keys if k not in leave_out},
                        title=f"{model}: corpus averages")
        paths.append(str(path))
    return paths
