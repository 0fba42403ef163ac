"""Kernel variants with compiler hints (occupancy, num_ctas), for the sweeper and the API.

``occupancy`` and ``num_ctas`` are options of the ``@ct.kernel`` decorator, not kernel
arguments: sweeping them means building new kernel objects from the same Python function.
``with_hints(kernel, occupancy=2)`` returns that variant (``kernel.replace_hints``, which
re-wraps the kernel's raw function with the new options), built once and cached, so every
launch of one variant hits the same cuTile JIT cache. The variant runs the very same
source: the simulator (which reads the raw function) sees no difference.

    launches = plan_fmha("fused", q, k, v, out, tiles={"TILE_M": 64, "TILE_N": 128}, ...)
    launches = apply_hints(launches, {"occupancy": 2, "num_ctas": 1})

``None`` (or a missing key) leaves an option to cuTile ("auto"). Nothing here imports
torch or launches anything.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping, Optional, Sequence

__all__ = ["HINT_KEYS", "HINT_RANGES", "with_hints", "apply_hints", "split_config",
           "check_hints"]

#: The hints a sweep config may carry, besides TILE_M / TILE_N.
HINT_KEYS = ("occupancy", "num_ctas")
#: Accepted values (cuTile 1.7's own validation): occupancy in [1, 32]; num_ctas a power
#: of two in [1, 16].
HINT_RANGES = {"occupancy": (1, 32), "num_ctas": (1, 16)}

_VARIANTS: dict = {}


def check_hints(hints: Optional[Mapping]) -> dict:
    """{"occupancy": int|None, "num_ctas": int|None} from a mapping; ValueError naming the
    bad key/value. Unknown keys are refused."""
    hints = dict(hints or {})
    unknown = set(hints) - set(HINT_KEYS)
    if unknown:
        raise ValueError(f"unknown kernel hint(s) {sorted(unknown)}; accepted: "
                         f"{', '.join(HINT_KEYS)}")
    out = {}
    for key in HINT_KEYS:
        v = hints.get(key)
        if v is None:
            out[key] = None
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{key} must be an int or None (auto), got {v!r}")
        lo, hi = HINT_RANGES[key]
        if not lo <= v <= hi or (key == "num_ctas" and v & (v - 1)):
            extra = ", a power of two" if key == "num_ctas" else ""
            raise ValueError(f"{key} must be in [{lo}, {hi}]{extra}, got {v}")
        out[key] = v
    return out


def with_hints(kernel, occupancy: Optional[int] = None, num_ctas: Optional[int] = None):
    """``kernel`` rebuilt with these decorator options; the kernel itself when both are
    None. Cached per (kernel, occupancy, num_ctas): the same object every time."""
    hints = check_hints({"occupancy": occupancy, "num_ctas": num_ctas})
    if hints["occupancy"] is None and hints["num_ctas"] is None:
        return kernel
    key = (kernel, hints["occupancy"], hints["num_ctas"])
    variant = _VARIANTS.get(key)
    if variant is None:
        set_hints = {k: v for k, v in hints.items() if v is not None}
        if hasattr(kernel, "replace_hints"):
            variant = kernel.replace_hints(**set_hints)
        else:   # older cuTile: re-decorate the raw function, keeping the other options
            import cuda.tile as ct
            opts = dataclasses.asdict(kernel._compiler_options)
            opts.update(set_hints)
            variant = ct.kernel(kernel._annotated_function.pyfunc, **opts)
        _VARIANTS[key] = variant
    return variant


def apply_hints(launches: Sequence, hints: Optional[Mapping]) -> list:
    """gpu.plan Launches with each kernel swapped for its hinted variant."""
    h = check_hints(hints)
    if h["occupancy"] is None and h["num_ctas"] is None:
        return list(launches)
    return [dataclasses.replace(L, kernel=with_hints(L.kernel, **h)) for L in launches]


def split_config(config: Mapping) -> tuple[dict, dict]:
    """A sweep config -> (tiles, hints): occupancy/num_ctas are hints (decorator options);
    everything else (TILE_M, TILE_N and kernel knobs such as LAT_K/LAT_V) goes into the
    tiles dict, which gpu.plan.plan_fmha validates (unknown knobs are refused there).
    None values are dropped (the plan's default)."""
    tiles = {k: v for k, v in config.items() if k not in HINT_KEYS and v is not None}
    hints = check_hints({k: config.get(k) for k in HINT_KEYS})
    return tiles, hints
