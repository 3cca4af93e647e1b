"""Glimmer's configuration (docs/muse-glimmer.md). It lives with the rest of Glimmer's
facts in ``arch/muse_glimmer.py``; this module is the short import path of its names."""
from .arch.muse_glimmer import ARCH, KEYS, LANE_KEY, LANES, GlimmerConfig

__all__ = ["ARCH", "KEYS", "LANE_KEY", "LANES", "GlimmerConfig"]
