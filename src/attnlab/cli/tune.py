"""attnlab tune: measure the kernel choices on this machine, once, and keep them in a profile.

Without a profile every choice follows a documented rule (docs/fast-path.md); the library never measures
while it computes. ``attnlab tune`` measures the five choices (numpy's exponential, the tile kernel, the decode
kernel, the layout of streamed weights, the quantized products' threads) and writes the profile
(:mod:`attnlab.kernels.profile`): ``$ATTNLAB_TUNE_FILE``, else ``$XDG_CACHE_HOME/attnlab/tune.json``, else
``~/.cache/attnlab/tune.json``. Later processes follow it; ``--show`` prints it, ``--reset`` removes it.
"""

from __future__ import annotations

import json
import sys

from ._app import add_command, add_json_flag, print_json


def register(sub) -> None:
    p = add_command(sub, "tune", help="measure the kernel choices on this machine once and keep them in a profile "
                    "that later runs follow (--show prints it, --reset removes it)", beyond="docs/fast-path.md",
                    shows="Shows what attnlab measures on this machine to choose its kernels, kept in a profile that "
                          "later runs follow instead of the documented rules",
                    examples=("attnlab tune", "attnlab tune --show", "attnlab tune --show --json",
                              "attnlab tune --reset"))
    what = p.add_mutually_exclusive_group()
    what.add_argument("--show", action="store_true", help="print the profile and whether it applies here")
    what.add_argument("--reset", action="store_true", help="remove the profile: the rules decide again")
    p.add_argument("--quick", action="store_true", help="fewer sizes (a few seconds; the choices are rougher)")
    add_json_flag(p)
    p.set_defaults(func=cmd_tune)


def cmd_tune(args) -> int:
    from ..kernels import profile

    if args.reset:
        path = profile.profile_path()
        removed = profile.remove()
        if args.json:
            print_json({"path": str(path), "removed": removed})
        else:
            print(f"removed {path}" if removed else f"no profile at {path}: nothing to remove")
        return 0
    if args.show:
        return show(profile.status(), as_json=args.json)
    from ..kernels import tuning

    def say(step):
        if not args.json:
            print(f"measuring {step} ...", file=sys.stderr, flush=True)
    choices, measured = tuning.measure(quick=args.quick, progress=say)
    path = profile.write(choices, measured)
    return show(profile.status(), as_json=args.json, written=path)


def show(status, *, as_json: bool, written=None) -> int:
    """Print the profile at ``status.path``: its choices and figures, or why there is none or it is ignored."""
    data = status.profile
    if data is None and status.path.is_file():
        try:
            data = json.loads(status.path.read_text())
        except (OSError, ValueError):
            data = None
    if as_json:
        print_json({"path": str(status.path), "applies": status.profile is not None, "reason": status.reason,
                    "profile": data})
        return 0
    if written is not None:
        print(f"wrote {written}")
    print(status.reason)
    if data is None or not isinstance(data, dict):
        return 0
    for line in profile_lines(data):
        print(line)
    return 0


def profile_lines(data: dict) -> list[str]:
    """The profile as text: the machine it was measured on, each choice, and the figures behind it."""
    ident, c, m = data.get("identity", {}), data.get("choices", {}), data.get("measured", {})
    lines = [f"measured on: {ident.get('cpu')} ({ident.get('simd')}); numpy {ident.get('numpy')}, numba "
             f"{ident.get('numba') or 'not installed'}, attnlab {ident.get('attnlab')}"]
    ns = m.get("exp_ns_per_element") or {}
    lines.append(f"numpy's exponential: {c.get('exp')}" + (f" (exp {ns['exp']:.2f}, exp2 {ns['exp2']:.2f} ns per "
                                                               "element)" if ns else ""))
    fmin = c.get("fused_min_scores") or {}
    for kind in ("masked", "full"):
        at = fmin.get(kind)
        where = "numpy at every size" if at is None else f"fused from {at:,} scores"
        lines.append(f"tile kernel, {kind} calls: {where}")
    for r in m.get("tile_kernels", []):
        lines.append(f"  n={r['n']:>5} {'causal' if r['masked'] else 'full  '} fused {r['fused_ms']:8.2f} ms  "
                     f"numpy {r['numpy_ms']:8.2f} ms  ({r['fused_ms'] / r['numpy_ms']:.2f}x)")
    for kind, table in (c.get("decode") or {}).items():
        lines.append(f"decode, {kind} heads: " + ", ".join(f"{n} keys {table[n]}" for n in sorted(table, key=int)))
    for r in m.get("decode_kernels", []):
        lines.append(f"  {r['kind']:>9} n_k={r['n_k']:>5} fused {r['fused_us']:8.1f} us  numpy {r['numpy_us']:8.1f} us")
    g = c.get("gemv_order") or {}
    ratios = m.get("gemv_f_over_c") or {}
    lines.append(f"streamed weights: wide {g.get('wide')}, tall {g.get('tall')}"
                 + (f" (F/C time: wide {ratios['wide']:.2f}, tall {ratios['tall']:.2f})" if ratios else ""))
    us = m.get("quantized_threads_us")
    lines.append(f"quantized products: {c.get('quantized_threads')} thread(s)"
                 + (" (" + ", ".join(f"{n}: {t:.0f} us" for n, t in us.items()) + ")" if us else ""))
    return lines
