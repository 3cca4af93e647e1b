"""Muse Glimmer's vision path: the tower over an ``mmproj`` file's packed
weights (``tower.py``) and the image and video preprocessing
(``preprocess.py``)."""
from __future__ import annotations

from .tower import Grid, VisionTower

__all__ = ["Grid", "VisionTower"]
