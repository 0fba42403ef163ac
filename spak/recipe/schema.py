"""Plan files: the engineering recipe as data, read and validated.

A plan (plans/fmha.toml; plans/README.md documents the format) lists the target archs,
the recipe's steps with their CPU and GPU gates, and one sweep space per arch. Each step
and each sweep space belongs to a kernel family (its ``family`` key; absent: the FMHA
forward), whose kernels, shape grammar, sweep-space keys and metric the fields are checked
against. `load_plan` reads and validates a plan completely before anything runs: every
problem is collected and reported with the path of the offending field, e.g.

    steps[2].gates.cpu.rel_l2.fp16: expected a number, got 'x'
    steps[1].kernel: unknown kernel 'fast'; known kernels: fused, naive
    sweep.sm_120.TILE_N[2]: 96 is not a power of two

and raised as one `PlanError`. Steps are indexed from 0 in paths, as in TOML's array of
tables order. The validated objects are in spak.recipe.model.

Stdlib only at import time (tomllib; `tomli` on Python 3.10): the families, the GPU
profiles and the simulator's models are looked up lazily, so `spak --help` stays cheap.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from spak.recipe.fields import FieldChecker, known_models, type_name
from spak.recipe.steps import parse_step
from spak.recipe.model import (DEFAULT_PLAN, KINDS, MAX_TILE, MIN_TILE, SCHEMA_VERSION,
                               CompileVariant, Plan, PlanError, Step, SweepSpace, Target,
                               ThroughputFloor, excluded, sim_agreement_for)

__all__ = ["PlanError", "Plan", "Step", "Target", "SweepSpace", "ThroughputFloor",
           "CompileVariant", "load_plan", "parse_plan", "excluded", "sim_agreement_for",
           "DEFAULT_PLAN", "KINDS", "SCHEMA_VERSION", "MIN_TILE", "MAX_TILE"]

_TOP = {"schema", "name", "title", "source", "targets", "steps", "sweep"}
_TARGET = {"gpus", "sim_model", "note"}
_SWEEP_EXTRA = {"max_tile", "knobs", "note", "exclude", "family"}


# ------------------------------------------------------------------ the sections

def _targets(v: FieldChecker, raw) -> dict:
    from spak.device.archs import ARCHS, PROFILES
    t = v.table("targets", raw, set(ARCHS) | set(raw if isinstance(raw, dict) else ()))
    out = {}
    if t is None:
        return out
    if not t:
        v.err("targets", "must name at least one arch")
    models = known_models()
    for arch, body in t.items():
        path = f"targets.{arch}"
        if arch not in ARCHS:
            v.err(path, f"unknown arch {arch!r}; known archs: {', '.join(ARCHS)}")
            continue
        b = v.table(path, body, _TARGET, required=("gpus",))
        if b is None:
            continue
        gpus = v.items(f"{path}.gpus", b.get("gpus", []), lambda p, x: v.string(p, x)) or []
        for i, g in enumerate(gpus):
            if g not in PROFILES:
                v.err(f"{path}.gpus[{i}]", f"unknown GPU {g!r}; spak.device.archs profiles: "
                                           f"{', '.join(PROFILES)}")
            elif PROFILES[g].arch != arch:
                v.err(f"{path}.gpus[{i}]", f"{g!r} is an {PROFILES[g].arch} GPU, not {arch}")
        sm = None
        if "sim_model" in b:
            sm = v.string(f"{path}.sim_model", b["sim_model"], models)
        out[arch] = Target(arch, tuple(gpus), sm)
    return out


def _space_value_check(v: FieldChecker, path: str, key: str, arch: str, max_tile: int):
    """The check of one value of sweep-space list ``key`` (by the key's meaning: a tile
    size, cuTile's occupancy or num_ctas hint, or another integer knob of the family)."""
    if "TILE" in key:
        return lambda p, x: v.tile(p, x, max_tile, f"{path}.max_tile")
    if key == "occupancy":
        return lambda p, x: v.integer(p, x, 1, 32)
    if key == "num_ctas":
        def cta(p, x):
            n = v.integer(p, x, 1, 16)
            if n is None:
                return None
            if n & (n - 1):
                return v.err(p, f"{n} is not a power of two (cuTile: num_ctas is 1, 2, 4, 8 "
                                f"or 16)")
            if n > 1 and arch == "sm_89":
                return v.err(p, f"num_ctas {n} needs thread-block clusters, which sm_89 does "
                                f"not have (compute capability 9.0+)")
            return n
        return cta
    return lambda p, x: v.integer(p, x, 0)


def _knobs(v: FieldChecker, path: str, raw) -> dict:
    knobs = {}
    kt = v.table(path, raw, set(raw) if isinstance(raw, dict) else set())
    for name, vals in (kt or {}).items():
        r = v.items(f"{path}.{name}", vals,
                    lambda p, x: x if isinstance(x, (int, float, str, bool)) else
                    v.err(p, f"expected a number, string or boolean, got {x!r}"))
        if r is not None:
            knobs[name] = tuple(r)
    return knobs


def _one_space(v: FieldChecker, arch: str, body) -> Optional[SweepSpace]:
    """[sweep.<arch>]: one list per space key of its family, and the extras."""
    path = f"sweep.{arch}"
    if not isinstance(body, dict):
        return v.err(path, f"expected a table, got {body!r}")
    fam = v.family(f"{path}.family", body)
    if fam is None:
        return None
    keys = tuple(fam.space_keys)
    b = v.table(path, body, set(keys) | _SWEEP_EXTRA, required=keys)
    mt = MAX_TILE
    if "max_tile" in b:
        mt = v.tile(f"{path}.max_tile", b["max_tile"]) or MAX_TILE
    lists = {k: v.items(f"{path}.{k}", b[k], _space_value_check(v, path, k, arch, mt))
             for k in keys if k in b}
    for k, vals in lists.items():
        if vals is not None and len(set(vals)) != len(vals):
            v.err(f"{path}.{k}", f"duplicate values in {vals}")
    knobs = _knobs(v, f"{path}.knobs", b["knobs"]) if "knobs" in b else {}
    note = v.string(f"{path}.note", b["note"]) if "note" in b else ""
    exclude = _exclude(v, f"{path}.exclude", b["exclude"], {**lists, **knobs}) \
        if "exclude" in b else ()
    if not all(lists.get(k) for k in keys) or exclude is None:
        return None
    sp = SweepSpace(arch, {k: tuple(lists[k]) for k in keys}, max_tile=mt, knobs=knobs,
                    note=note or "", exclude=exclude, family=fam.name)
    if not sp.configs():
        return v.err(f"{path}.exclude", "excludes every config of the space")
    return sp


def _sweep(v: FieldChecker, raw, targets: dict) -> dict:
    from spak.device.archs import ARCHS
    out = {}
    if raw is None:
        return out
    t = v.table("sweep", raw, set(raw) if isinstance(raw, dict) else set())
    if t is None:
        return out
    for arch, body in t.items():
        if arch not in ARCHS:
            v.err(f"sweep.{arch}", f"unknown arch {arch!r}; known archs: {', '.join(ARCHS)}")
        elif arch not in targets:
            v.err(f"sweep.{arch}", f"{arch} is not in [targets] ({', '.join(targets) or 'none'})")
        else:
            sp = _one_space(v, arch, body)
            if sp is not None:
                out[arch] = sp
    return out


def _exclude(v: FieldChecker, path, raw, lists: dict):
    """[sweep.<arch>].exclude: a list of tables, each naming keys of the space (a space key
    or a knob) with one of that key's values. Returns a tuple of sorted (key, value)
    tuples, or None after an error."""
    def one(p, x):
        t = v.table(p, x, set(lists))
        if t is None:
            return None
        if not t:
            return v.err(p, "an empty entry would exclude every config")
        if not set(t) <= set(lists):
            return None                   # unknown key: table() said so
        for k, val in t.items():
            if lists.get(k) is not None and val not in lists[k]:   # None: reported above
                return v.err(f"{p}.{k}", f"{val!r} is not among the space's {k} values "
                                         f"{list(lists[k])}")
        return tuple(sorted(t.items()))
    r = v.items(path, raw, one)
    return None if r is None else tuple(r)


# --------------------------------------------------------------------- the plan

def _warn_floors(v: FieldChecker, steps, targets):
    """A TFLOPS floor above the peak of every GPU of its arch cannot be met: say so (not an
    error)."""
    from spak.device.archs import PROFILES, peak_tflops
    for s in steps:
        if s.kernel_family.metric != "TFLOPS":
            continue
        for j, f in enumerate(s.floors):
            gpus = targets[f.arch].gpus if f.arch in targets else ()
            peaks = [peak_tflops(PROFILES[g], f.dtype) for g in gpus if g in PROFILES]
            if peaks and f.floor > max(peaks):
                v.warnings.append(
                    f"steps[{s.index}].gates.gpu.tflops[{j}]: floor {f.floor:g} TFLOPS exceeds "
                    f"the {f.arch} peak dense {f.dtype} tensor rate with fp32 accumulate "
                    f"({max(peaks):g}, spak.device.archs)"
                    f"{'' if f.verified else '; it is unverified'}")


def _check_steps(v: FieldChecker, steps, doc: dict, targets, sweep) -> None:
    """Across steps: unique ids; a sweep step has a space of its own family on every arch."""
    ids = [s.id for s in steps]
    given = doc.get("sweep") if isinstance(doc.get("sweep"), dict) else {}
    for s in steps:
        if ids.count(s.id) > 1 and ids.index(s.id) != s.index:
            v.err(f"steps[{s.index}].id", f"duplicate step id {s.id!r}")
        if s.kind != "sweep":
            continue
        for arch in targets:
            if arch not in given:       # present but invalid: already reported
                v.err(f"sweep.{arch}", f"missing: step {s.id!r} sweeps on every target "
                                       f"arch, so [sweep.{arch}] is required")
            elif arch in sweep and sweep[arch].family != s.family:
                v.err(f"steps[{s.index}].family",
                      f"{s.family}, but [sweep.{arch}] is the {sweep[arch].family} family's "
                      f"space: one plan file sweeps one family (give the other its own plan)")


def parse_plan(doc: dict, path: Optional[Path] = None) -> Plan:
    """Validate a parsed TOML document; returns a Plan or raises PlanError (all problems)."""
    v = FieldChecker()
    src = str(path) if path is not None else "plan"
    if not isinstance(doc, dict):
        raise PlanError([f"(top level): expected a table, got {type_name(doc)}"], src)
    v.table("", doc, _TOP, required=("schema", "name", "title", "targets", "steps"))
    if "schema" in doc:
        if v.integer("schema", doc["schema"]) is not None and doc["schema"] != SCHEMA_VERSION:
            v.err("schema", f"this SPAK reads plan schema {SCHEMA_VERSION}, got {doc['schema']}")
    name = v.string("name", doc["name"]) if "name" in doc else None
    title = v.string("title", doc["title"]) if "title" in doc else None
    source = v.string("source", doc["source"]) if "source" in doc else ""
    targets = _targets(v, doc["targets"]) if "targets" in doc else {}
    sweep = _sweep(v, doc.get("sweep"), targets)
    limits = {a: (sweep[a].max_tile if a in sweep else MAX_TILE) for a in targets}
    steps: list[Step] = []
    raw_steps = doc.get("steps")
    if raw_steps is not None:
        if not isinstance(raw_steps, list):
            v.err("steps", f"expected an array of tables ([[steps]]), got {raw_steps!r}")
        elif not raw_steps:
            v.err("steps", "must hold at least one step")
        else:
            steps = [s for i, rs in enumerate(raw_steps)
                     if (s := parse_step(v, i, rs, targets, limits)) is not None]
    _check_steps(v, steps, doc, targets, sweep)
    if not v.errors:
        _warn_floors(v, steps, targets)
    if v.errors:
        raise PlanError(v.errors, src)
    return Plan(path=path, name=name, title=title, source=source or "", targets=targets,
                steps=tuple(steps), sweep=sweep, warnings=tuple(v.warnings), raw=doc)


def _toml():
    if sys.version_info >= (3, 11):
        import tomllib
        return tomllib
    try:
        import tomli
        return tomli
    except ImportError:
        raise PlanError(["reading plans on Python 3.10 needs the 'tomli' package "
                         "(pip install tomli), or Python 3.11+"]) from None


def load_plan(path=None) -> Plan:
    """Read and validate a plan file (default plans/fmha.toml). Raises PlanError."""
    p = Path(path) if path is not None else DEFAULT_PLAN
    toml = _toml()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise PlanError([f"cannot read the plan: {e.strerror or e}"], str(p)) from None
    except UnicodeDecodeError as e:
        raise PlanError([f"not a UTF-8 text file ({e.reason} at byte {e.start})"],
                        str(p)) from None
    try:
        doc = toml.loads(text)
    except toml.TOMLDecodeError as e:
        raise PlanError([f"not valid TOML: {e}"], str(p)) from None
    return parse_plan(doc, p)
