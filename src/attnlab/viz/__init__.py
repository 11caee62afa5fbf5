"""Pictures of attention: PNG heatmaps (matplotlib), a self-contained HTML page, terminal grids (rich).

Everything draws an :class:`attnlab.AttentionMap`, except ``save_head`` and ``save_mask``, which take
one grid or a token list. Importing this package imports only numpy; matplotlib and rich are imported
by the functions that need them.
"""

from .demo import demo_map
from .png import save_head, save_layer, save_mask, save_model_view

__all__ = ["demo_map", "save_head", "save_layer", "save_mask", "save_model_view"]
