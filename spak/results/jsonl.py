"""Result files: how SPAK turns a result row into strict JSON, and how it names the file
a row came from.

Non-finite floats become null (NaN/Inf counts are reported in their own fields), numpy and
torch scalars become python numbers, paths become strings, dict keys become strings.
"""
from __future__ import annotations

import math
from pathlib import Path, PurePath

ROOT = Path(__file__).resolve().parents[2]


def repo_path(path) -> str:
    """`path` relative to the repository when inside it (as recorded in reports), else as given."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


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
