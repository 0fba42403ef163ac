"""Small statistics shared by the timers, the store and the reports."""
from __future__ import annotations

import math
from typing import Iterable, Optional


def stats(ms: list[float]) -> dict:
    """median, min, max, p25, p75 (ms) and the relative spread (p75-p25)/median."""
    s = sorted(ms)
    n = len(s)

    def q(f):
        i = f * (n - 1)
        lo, hi = int(math.floor(i)), int(math.ceil(i))
        return s[lo] + (s[hi] - s[lo]) * (i - lo)
    med = q(0.5)
    return {"ms_median": med, "ms_min": s[0], "ms_max": s[-1], "ms_p25": q(0.25),
            "ms_p75": q(0.75), "spread": (q(0.75) - q(0.25)) / med if med else None,
            "runs": n}


def geomean(xs: Iterable) -> Optional[float]:
    """Geometric mean of the positive numbers in `xs` (None and 0 skipped); None if none."""
    xs = [float(x) for x in xs if x]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None
