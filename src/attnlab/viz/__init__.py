"""Pictures of attention: PNG heatmaps (matplotlib)."""

from .png import save_head, save_mask

__all__ = ["save_head", "save_mask"]
