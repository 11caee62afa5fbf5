"""attnlab tour: the guide, section by section."""

from __future__ import annotations

import numpy as np

from .. import attention
from ._app import add_json_flag, print_json


def register(sub) -> None:
    p = sub.add_parser("tour", help="run the guide's examples in order")
    add_json_flag(p)
    p.set_defaults(func=cmd_tour)


def cmd_tour(args) -> int:
    k = np.array([[0., 0.], [2., 0.], [1., 1.]])    # (3, 2) keys of the, cat, sat
    v = np.array([[1., 0.], [0., 1.], [1., 1.]])    # (3, 2) values of the, cat, sat
    q = np.array([[1., 0.]])                        # (1, 2) query of sat
    out, a = attention(q, k, v, scale=1.0, return_weights=True)
    if args.json:
        print_json({"weights": a[0], "output": out[0]})
    else:
        print("The soft lookup for 'sat' in 'the cat sat'")
        print("weights", np.array2string(a[0], precision=3, floatmode="fixed"),
              "output", np.array2string(out[0], precision=3, floatmode="fixed"))
    return 0
