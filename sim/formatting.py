"""Printing tiles from kernels: `ct.print(f"x={tile}")`, the builtin `print` (which cuTile's
compiler treats as ct.print) and `ct.printf`. Formats follow the stub: a tile prints as a
nested list, ints as %d, floats as %f unless the f-string gives a format spec.

An f-string is evaluated once for a whole lock-step group, whose lanes (blocks) hold
different values; so a tile formatted there becomes a marker, and ct.print substitutes
each lane's own values when it prints that lane's line.
"""
from __future__ import annotations

import re

import numpy as np

_MARK = re.compile("\x00T(\\d+)\x00")


def _element(v, spec: str) -> str:
    if spec:
        return format(v.item() if hasattr(v, "item") else v, spec)
    if isinstance(v, (np.floating, float)):
        return f"{float(v):f}"
    return str(v.item() if hasattr(v, "item") else v)


def _nested(a: np.ndarray, spec: str) -> str:
    if a.ndim == 0:
        return _element(a[()], spec)
    return "[" + ", ".join(_nested(x, spec) for x in a) + "]"


def lane_text(tile, lane: int, spec: str = "") -> str:
    """A tile's values in one lane (block), as cuTile prints them."""
    v = tile.v[min(lane, tile.v.shape[0] - 1)]
    if tile.dtype.name == "bool_" or v.dtype == np.bool_:
        v = v.astype(np.int32)
    return _nested(np.asarray(v), spec)


def format_tile(tile, spec: str) -> str:
    """Tile.__format__: the text when every lane agrees, else a marker for ct.print."""
    from .context import current
    if tile.v.shape[0] == 1:
        return lane_text(tile, 0, spec)
    ctx = current()
    ctx.formats.append((tile, spec))
    return f"\x00T{len(ctx.formats) - 1}\x00"


def expand(text: str, lane: int, formats) -> str:
    """A string with markers, for one lane."""
    def one(m):
        tile, spec = formats[int(m.group(1))]
        return lane_text(tile, lane, spec)
    return _MARK.sub(one, text)
