"""Muse Glimmer's vision path: the tower over an ``mmproj`` file's packed
weights (``tower.py``), the image and video preprocessing
(``preprocess.py``) and a video's frames and times (``video.py``)."""
from __future__ import annotations

from .tower import Grid, GridPlan, VisionTower
from .video import Video

__all__ = ["Grid", "GridPlan", "VisionTower", "Video"]
