"""Strict JSON for result files: one place for how SPAK turns a result row into JSON.

Non-finite floats become null (NaN/Inf counts are reported in their own fields), numpy and
torch scalars become python numbers, paths become strings, dict keys become strings.
"""
from __future__ import annotations

import math
from pathlib import PurePath


def jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, PurePath):
        return str(x)
    if hasattr(x, "item") and callable(x.item):        # numpy / torch scalars
        return jsonable(x.item())
    return x
