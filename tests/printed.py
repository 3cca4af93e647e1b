"""Reading numbers back from what a command printed (the bench tests check
that every measured number is finite and positive)."""
from __future__ import annotations

import re

_NUMBER = re.compile(r"(?<![\w.])(?:[-+]?(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?|nan|inf)", re.I)


def numbers(text: str) -> list[float]:
    """Every number printed in ``text``: '1.35x' and '2.5e-05' count, '-',
    '16x512' (a shape) and words do not; 'nan' and 'inf' do, so a test sees them."""
    return [float(m) for m in _NUMBER.findall(text)]
