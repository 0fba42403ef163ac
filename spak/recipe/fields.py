"""Typed checks of a plan's fields that collect every problem instead of stopping at the
first: `FieldChecker`. Each check returns the value (or None when it is wrong) and records
"path: message" for the plan's `PlanError`. The kernel families and the simulator's
models are looked up lazily (cheap to import)."""
from __future__ import annotations

from typing import Callable, Optional

from spak.recipe.model import MAX_TILE, MIN_TILE

__all__ = ["FieldChecker", "type_name", "known_models"]


def known_models() -> tuple[str, ...]:
    """The simulator's numeric models (these where the simulator cannot be imported)."""
    try:
        from spak.sim.numerics import MODELS
        return tuple(MODELS)
    except Exception:  # noqa: BLE001 -- absent or broken: the names are still these
        return ("sm_90", "sm_120", "ieee")


def type_name(v) -> str:
    """"an integer", "a table", ... for messages."""
    if isinstance(v, bool):
        return "a boolean"
    return {int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(v), type(v).__name__)


class FieldChecker:
    """Collects errors and warnings; each check returns the value (None when it is wrong)."""

    def __init__(self):
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def err(self, path: str, msg: str):
        self.errors.append(f"{path}: {msg}")
        return None

    def table(self, path, v, keys, required=()):
        if not isinstance(v, dict):
            return self.err(path, f"expected a table, got {v!r}")
        for k in v:
            if k not in keys:
                self.err(f"{path}.{k}" if path else k,
                         f"unknown key; expected one of: {', '.join(sorted(keys))}")
        for k in required:
            if k not in v:
                self.err(f"{path}.{k}" if path else k, "missing (required)")
        return v

    def string(self, path, v, choices=None):
        if not isinstance(v, str):
            return self.err(path, f"expected a string, got {v!r}")
        if choices is not None and v not in choices:
            return self.err(path, f"{v!r} is not one of: {', '.join(choices)}")
        return v

    def boolean(self, path, v):
        if not isinstance(v, bool):
            return self.err(path, f"expected true or false, got {v!r}")
        return v

    def integer(self, path, v, lo=None, hi=None):
        if isinstance(v, bool) or not isinstance(v, int):
            return self.err(path, f"expected an integer, got {v!r}")
        if lo is not None and v < lo or hi is not None and v > hi:
            rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
            return self.err(path, f"{v} is out of range {rng}")
        return v

    def number(self, path, v, lo=None, hi=None, positive=False):
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return self.err(path, f"expected a number, got {v!r}")
        v = float(v)
        if v != v:
            return self.err(path, "expected a number, got nan")
        if positive and not v > 0:
            return self.err(path, f"must be > 0, got {v:g}")
        if lo is not None and v < lo or hi is not None and v > hi:
            return self.err(path, f"{v:g} is out of range [{lo}, {hi}]")
        return v

    def items(self, path, v, item: Callable, nonempty=True) -> Optional[list]:
        """A list whose every entry passes ``item(path[i], entry)``; None if any fails."""
        if not isinstance(v, list):
            return self.err(path, f"expected a list, got {v!r}")
        if nonempty and not v:
            return self.err(path, "must not be empty")
        out = [item(f"{path}[{i}]", x) for i, x in enumerate(v)]
        return None if any(x is None for x in out) else out

    def tile(self, path, v, max_tile=MAX_TILE, max_from=None):
        n = self.integer(path, v)
        if n is None:
            return None
        if n < MIN_TILE:
            return self.err(path, f"{n} is below the smallest tile {MIN_TILE} "
                                  f"(the tensor-core K minimum)")
        if n & (n - 1):
            return self.err(path, f"{n} is not a power of two (cuTile tiles are)")
        if n > MAX_TILE:
            return self.err(path, f"{n} is above the largest tile {MAX_TILE}")
        if n > max_tile:
            return self.err(path, f"{n} is larger than {max_from or 'max_tile'} ({max_tile}) "
                                  f"allows")
        return n

    def family(self, path: str, table: dict):
        """The KernelFamily a table's ``family`` key names (absent: the default), or None."""
        from spak import families
        if "family" not in table:
            return families.get()
        name = self.string(path, table["family"])
        if name is None:
            return None
        if name not in families.names():
            return self.err(path, f"unknown kernel family {name!r}; known families: "
                                  f"{', '.join(families.names())}")
        return families.get(name)

    def shape(self, path: str, text, fam):
        """One item of a shape list: a set name or one shape in the family's grammar."""
        from spak.core.errors import ShapeError
        s = self.string(path, text)
        if s is None:
            return None
        item = s.strip()
        if "," in item and item.lower() not in fam.shape_sets:
            return self.err(path, f"{s!r}: one shape or set per list item (no commas)")
        try:
            fam.check_shape_item(item)
        except ShapeError as e:
            return self.err(path, str(e))
        return item
