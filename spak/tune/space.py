"""The sweep's search space: parsing ``--space``, reading the plan's ``[sweep.<arch>]``,
the cross product less the excluded configs, and config ids.

A space is ``{key: [values]}`` over a kernel family's ``space_keys`` (plus its kernel
knobs), e.g. ``{"TILE_M": [64, 128], "TILE_N": [64, 128], "occupancy": [2, 3, 4],
"num_ctas": [1, 2]}``, and optionally ``"exclude"``: partial configs to leave out.

Key kinds: a key naming a tile (it contains "TILE", e.g. TILE_M, DKV_TILE_N) takes powers
of two in [16, 256] and is never "auto"; the kernel hints take ``occupancy`` 1..32 and
``num_ctas`` a power of two 1..16, or auto (None: left to cuTile); a family's knobs take
0..10 (0: the compiler's choice); any other key takes an integer or auto.
"""
from __future__ import annotations

import itertools
from pathlib import Path
from typing import Optional

from spak import families

__all__ = ["SPACE_KEYS", "EXCLUDE", "DEFAULT_PLAN", "ROOT", "config_id", "tile_keys",
           "parse_space_args", "load_space", "expand_space", "describe_override"]

#: The FMHA forward's space keys (its config ids are "TILE_MxTILE_N/o<occupancy>/c<ctas>").
SPACE_KEYS = ("TILE_M", "TILE_N", "occupancy", "num_ctas")
#: The space key holding the plan's excluded partial configs (not a list of values).
EXCLUDE = "exclude"
ROOT = Path(__file__).resolve().parents[2]
#: The recipe plan (the default family's sweep_plan).
DEFAULT_PLAN = ROOT / "plans" / "fmha.toml"
_HINTS = ("occupancy", "num_ctas")


def _family(family):
    return families.get(family) if family is None or isinstance(family, str) else family


def tile_keys(keys) -> list[str]:
    return [k for k in keys if "TILE" in k]


# ------------------------------------------------------------------ config ids

def config_id(cfg: Optional[dict], keys=SPACE_KEYS) -> str:
    """"64x128", "64x128/o2", "128x64/o1/c2" (o: occupancy, c: num_ctas; omitted = auto);
    tile pairs with a prefix read "DKV64x128/DQ64x64"; other keys "/KEY=value"."""
    if cfg is None:
        return "-"
    tiles = tile_keys(keys)
    parts, named = [], set()
    for k in tiles:
        n = k[:-1] + "N"
        if k.endswith("TILE_M") and n in tiles:
            parts.append(f"{k[:-len('TILE_M')].rstrip('_')}{cfg[k]}x{cfg[n]}")
            named |= {k, n}
    parts += [f"{k}={cfg[k]}" for k in tiles if k not in named]
    s = "/".join(parts)
    if cfg.get("occupancy") is not None:
        s += f"/o{cfg['occupancy']}"
    if cfg.get("num_ctas") is not None:
        s += f"/c{cfg['num_ctas']}"
    for k in sorted(set(cfg) - set(tiles) - set(_HINTS)):
        if cfg[k] is not None:
            s += f"/{k}={cfg[k]}"
    return s


# ------------------------------------------------------------------ values

def _space_value(key: str, text, knobs=()) -> Optional[int]:
    tile = "TILE" in key
    if isinstance(text, str) and text.strip().lower() in ("auto", "none", "null", "-"):
        if tile:
            raise ValueError(f"{key} cannot be auto")
        return None
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {text!r} is not an integer") from None
    if tile and (v < 16 or v > 256 or v & (v - 1)):
        raise ValueError(f"{key}: {v} is not a power of two in [16, 256]")
    if key == "occupancy" and not 1 <= v <= 32:
        raise ValueError(f"occupancy: {v} is not in [1, 32] (or auto)")
    if key == "num_ctas" and (not 1 <= v <= 16 or v & (v - 1)):
        raise ValueError(f"num_ctas: {v} is not a power of two in [1, 16] (or auto)")
    if key in knobs and not 0 <= v <= 10:
        raise ValueError(f"{key}: {v} is not in [0, 10] (0: the compiler's choice)")
    return v


def _canon_key(k: str, keys) -> str:
    m = {s.lower(): s for s in keys}
    if k.lower() not in m:
        raise ValueError(f"unknown space key {k!r}; accepted: {', '.join(keys)}")
    return m[k.lower()]


def parse_space_args(items, family=None) -> dict:
    """["TILE_M=64,128", "occupancy=1,auto"] -> {"TILE_M": [64, 128], "occupancy": [1, None]},
    over the family's space keys and knobs (default family: the FMHA forward)."""
    fam = _family(family)
    knobs = fam.knob_keys()
    keys = (*fam.space_keys, *knobs)
    out = {}
    for item in items or ():
        for part in item.split():
            if "=" not in part:
                raise ValueError(f"--space item {part!r} is not KEY=V1,V2 (e.g. TILE_M=64,128)")
            k, vals = part.split("=", 1)
            key = _canon_key(k.strip(), keys)
            values = [_space_value(key, v, knobs) for v in vals.split(",") if v.strip()]
            if not values:
                raise ValueError(f"--space {key}: no values")
            out[key] = list(dict.fromkeys(values))
    return out


def describe_override(override: dict) -> str:
    """" with --space TILE_M=64 occupancy=1,auto" (what the space source line adds)."""
    if not override:
        return ""
    return " with --space " + " ".join(
        f"{k}={','.join('auto' if v is None else str(v) for v in vals)}"
        for k, vals in override.items())


# ------------------------------------------------------------------ the plan

def _plan_space(p: Path, arch: str, fam) -> tuple[Optional[dict], str]:
    """(the family's [sweep.<arch>] lists, "") through spak.recipe.schema's validating
    loader, or (None, why not) when the plan has no space of this family for ``arch``."""
    from spak.recipe.schema import load_plan
    try:
        plan = load_plan(p)
    except Exception as e:  # noqa: BLE001 -- PlanError and friends
        raise ValueError(f"the plan {p} does not load: {e}") from None
    try:
        sp = plan.sweep_space(arch)
    except KeyError as e:
        return None, str(e).strip("'\"")
    owner = getattr(sp, "family", families.DEFAULT)
    if owner != fam.name:
        return None, f"{p} [sweep.{arch}] is the space of {owner}, not {fam.name}"
    space = {k: list(getattr(sp, k)) for k in fam.space_keys}
    for k, v in (getattr(sp, "knobs", None) or {}).items():
        space[k] = list(v)
    if getattr(sp, "exclude", ()):
        space[EXCLUDE] = [dict(e) for e in sp.exclude]
    return space, ""


def load_space(plan_path, arch: str, family=None) -> tuple[dict, str]:
    """(space, where it came from) for ``arch`` and the family (default: the FMHA forward):
    the plan's [sweep.<arch>] lists (default plan: the family's ``sweep_plan``). A plan that
    does not load is an error (ValueError naming the problem); a plan without
    [sweep.<arch>], or no plan file, falls back to the family's ``sweep_fallback``
    (ValueError if that has no entry either)."""
    fam = _family(family)
    if plan_path:
        p = Path(plan_path)
    else:
        p = ROOT / fam.sweep_plan if fam.sweep_plan else None
    if p is not None and p.exists():
        space, note = _plan_space(p, arch, fam)
        if space is not None:
            return space, f"{p} [sweep.{arch}]"
    else:
        note = f"no plan file {p}" if p is not None else f"{fam.name} names no plan file"
    fallback = fam.sweep_fallback
    if arch not in fallback:
        raise ValueError(f"{note}, and SPAK has no built-in sweep space for {arch} "
                         f"(it has {', '.join(fallback) or 'none'}); pass --space")
    return {k: list(v) for k, v in fallback[arch].items()}, \
        f"built-in space for {arch} ({note})"


def expand_space(space: dict, family=None) -> list[dict]:
    """The cross product of a space, as config dicts (the tile keys required), less the
    configs matching an entry of ``space["exclude"]`` (the plan's known-bad combinations,
    spak.recipe.schema.excluded)."""
    from spak.recipe.schema import excluded
    keys = _family(family).space_keys
    for k in tile_keys(keys):
        if not space.get(k):
            raise ValueError(f"the sweep space has no {k} values")
    order = list(keys) + [k for k in space if k not in keys and k != EXCLUDE]
    lists = [space.get(k) or [None] for k in order]
    seen = {}
    for combo in itertools.product(*lists):
        cfg = dict(zip(order, combo))
        if not excluded(cfg, space.get(EXCLUDE, ())):
            seen.setdefault(config_id(cfg, keys), cfg)
    return list(seen.values())
