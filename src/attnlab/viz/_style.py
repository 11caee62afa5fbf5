"""What every picture shares: the colour ramp, the masked-cell colour, and how a token is shown.

The ramp is ColorBrewer's "Blues", the same nine colours matplotlib's ``Blues`` colour map is built
from, so a PNG, the HTML page and the terminal shade a weight alike without importing matplotlib.
"""

from __future__ import annotations

import numpy as np

BLUES = ("#f7fbff", "#deebf7", "#c6dbef", "#9ecae1", "#6baed6",
         "#4292c6", "#2171b5", "#08519c", "#08306b")    # weight 0 … 1, evenly spaced
MASKED_COLOUR = "#d0d0d0"    # grey: a cell the query may not see, never the near-white of weight 0
DARK_ABOVE = 0.6             # write text in white on cells darker than this weight
_CONTROL = {"\n": "↵", "\r": "␍", "\t": "⇥"}


def _rgb(hex_colour: str) -> tuple[int, int, int]:
    return tuple(int(hex_colour[i:i + 2], 16) for i in (1, 3, 5))


_RAMP = np.array([_rgb(c) for c in BLUES], dtype=np.float64)    # (9, 3)


def shade(w: float) -> tuple[int, int, int]:
    """The (r, g, b) of weight ``w`` in [0, 1] on the Blues ramp, interpolated linearly.

    >>> shade(0.0), shade(1.0)
    ((247, 251, 255), (8, 48, 107))
    """
    x = float(np.clip(w, 0.0, 1.0)) * (len(BLUES) - 1)
    i = min(int(x), len(BLUES) - 2)
    rgb = _RAMP[i] + (x - i) * (_RAMP[i + 1] - _RAMP[i])    # (3,)
    return tuple(int(round(c)) for c in rgb)


def display_token(token: str, limit: int | None = None) -> str:
    """``token`` with line breaks and tabs made visible (↵, ⇥), cut to ``limit`` characters with "…".

    >>> display_token("a\\nb"), display_token("attention", 5)
    ('a↵b', 'atte…')
    """
    text = "".join(_CONTROL.get(c, "�" if ord(c) < 32 or ord(c) == 127 else c) for c in token)
    if limit is not None and len(text) > limit:
        text = text[:max(limit - 1, 0)] + "…"
    return text
