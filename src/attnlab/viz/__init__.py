"""Pictures of attention: PNG heatmaps (matplotlib), a self-contained HTML page, terminal grids (rich).

Everything draws an :class:`attnlab.AttentionMap`, except ``save_head`` and ``save_mask``, which take
one grid or a token list. Importing this package imports only numpy; matplotlib and rich are imported
by the functions that need them.
"""

from .demo import demo_map
from .html import render_html, save_html, show
from .png import save_head, save_layer, save_mask, save_model_view
from .terminal import terminal_grid, terminal_text

__all__ = [
    "demo_map",
    "render_html",
    "save_head",
    "save_html",
    "save_layer",
    "save_mask",
    "save_model_view",
    "show",
    "terminal_grid",
    "terminal_text",
]
