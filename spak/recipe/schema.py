"""Plan files: the engineering recipe as data (schema, loader, validation).

A plan (plans/fmha.toml; plans/README.md documents the format) lists the target archs,
the recipe's steps with their CPU and GPU gates, and one sweep space per arch. `load_plan`
reads and validates it completely before anything runs: every problem is collected and
reported with the path of the offending field, e.g.

    steps[2].gates.cpu.rel_l2.fp16: expected a number, got 'x'
    steps[1].kernel: unknown kernel 'fast'; known kernels: fused, naive
    sweep.sm_120.TILE_N[2]: 96 is not a power of two

and raised as one `PlanError`. Steps are indexed from 0 in paths, as in TOML's array of
tables order.

Stdlib only at import time (tomllib; `tomli` on Python 3.10): the kernel names and the
simulator's models are looked up lazily, so `spak --help` stays cheap.
"""
from __future__ import annotations

import dataclasses
import itertools
import re
import sys
from pathlib import Path
from typing import Any, Optional

__all__ = ["PlanError", "Plan", "Step", "Target", "SweepSpace", "TflopsFloor", "CompileVariant",
           "load_plan", "parse_plan", "DEFAULT_PLAN", "KINDS", "SCHEMA_VERSION", "MIN_TILE",
           "MAX_TILE"]

SCHEMA_VERSION = 1
DEFAULT_PLAN = Path(__file__).resolve().parents[2] / "plans" / "fmha.toml"
KINDS = ("prototype", "kernel", "sweep")
DTYPES = ("fp16", "bf16")
CAUSAL = ("yes", "no", "both")
MIN_TILE, MAX_TILE = 16, 256          # gpu.plan's bounds (powers of two)
MAX_HEAD_DIM = 256
_ID_RE = re.compile(r"^[a-z][a-z0-9_-]*$")


class PlanError(ValueError):
    """A plan that cannot be used; `.errors` lists every problem ("path: message")."""

    def __init__(self, errors, source: str = "plan"):
        self.errors = list(errors)
        self.source = source
        n = len(self.errors)
        head = f"{source}: {n} problem{'s' if n != 1 else ''}"
        super().__init__(head + ":\n  " + "\n  ".join(self.errors))


# --------------------------------------------------------------------- the model

@dataclasses.dataclass(frozen=True)
class Target:
    arch: str
    gpus: tuple[str, ...]
    sim_model: Optional[str]


@dataclasses.dataclass(frozen=True)
class CompileVariant:
    dtype: str                    # fp16 | bf16
    head_dim: int
    causal: bool
    mask: bool
    tiles: Optional[tuple] = None  # (("TILE_M", m), ("TILE_N", n)); None: the arch default

    @property
    def tiles_dict(self) -> Optional[dict]:
        return dict(self.tiles) if self.tiles else None

    @property
    def label(self) -> str:
        s = f"{self.dtype} D={self.head_dim} {'causal' if self.causal else 'noncausal'}"
        s += " mask" if self.mask else ""
        if self.tiles:
            t = dict(self.tiles)
            s += f" {t['TILE_M']}x{t['TILE_N']}"
        return s


@dataclasses.dataclass(frozen=True)
class TflopsFloor:
    arch: str
    floor: float
    verified: bool
    source: str
    head_dim: Optional[int] = None
    min_seq: Optional[int] = None
    causal: Optional[bool] = None
    dtype: str = "fp16"

    def applies(self, spec) -> bool:
        """Does this floor judge the ProblemSpec `spec`?"""
        return ((self.head_dim is None or spec.D == self.head_dim)
                and (self.min_seq is None or spec.Sk >= self.min_seq)
                and (self.causal is None or spec.causal == self.causal)
                and spec.dtype == self.dtype and spec.mask is None)

    @property
    def label(self) -> str:
        parts = [f"{self.dtype}"]
        if self.head_dim is not None:
            parts.append(f"D={self.head_dim}")
        if self.min_seq is not None:
            parts.append(f"S>={self.min_seq}")
        if self.causal is not None:
            parts.append("causal" if self.causal else "non-causal")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True)
class SweepSpace:
    arch: str
    TILE_M: tuple[int, ...]
    TILE_N: tuple[int, ...]
    occupancy: tuple[int, ...]
    num_ctas: tuple[int, ...]
    max_tile: int = MAX_TILE
    knobs: dict = dataclasses.field(default_factory=dict)
    note: str = ""
    #: partial configs to leave out: a config matching every key of one entry is skipped
    exclude: tuple = ()

    def configs(self) -> list[dict]:
        """The cross product less the excluded, as dicts {"TILE_M", "TILE_N", "occupancy",
        "num_ctas", knobs...}."""
        names = ["TILE_M", "TILE_N", "occupancy", "num_ctas", *self.knobs]
        lists = [self.TILE_M, self.TILE_N, self.occupancy, self.num_ctas, *self.knobs.values()]
        return [c for c in (dict(zip(names, combo)) for combo in itertools.product(*lists))
                if not excluded(c, self.exclude)]

    def tile_pairs(self) -> list[tuple[int, int]]:
        return list(itertools.product(self.TILE_M, self.TILE_N))

    def as_dict(self) -> dict:
        return {"TILE_M": list(self.TILE_M), "TILE_N": list(self.TILE_N),
                "occupancy": list(self.occupancy), "num_ctas": list(self.num_ctas),
                "max_tile": self.max_tile, "knobs": {k: list(v) for k, v in self.knobs.items()},
                "exclude": [dict(e) for e in self.exclude]}


def excluded(cfg: dict, exclude) -> bool:
    """Whether config ``cfg`` matches every key of some entry of ``exclude`` (a sequence of
    dicts or of (key, value) pairs)."""
    return any(all(cfg.get(k) == v for k, v in dict(e).items()) for e in exclude)


@dataclasses.dataclass(frozen=True)
class Step:
    index: int
    id: str
    title: str
    kind: str
    kernel: Optional[str] = None
    shapes: tuple[str, ...] = ()
    sim_shapes: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = DTYPES
    causal: str = "both"
    models: tuple[str, ...] = ("sm_90",)
    tiles: Optional[dict] = None
    seed: int = 0
    cpu: dict = dataclasses.field(default_factory=dict)   # validated gates.cpu
    gpu: dict = dataclasses.field(default_factory=dict)   # validated gates.gpu

    @property
    def name(self) -> str:
        return f"step {self.index + 1} ({self.id})"

    def cases(self, shapes=None, dtypes=None, causal=None) -> list:
        """The step's shapes expanded to ProblemSpecs (spak.attention.problems.expand)."""
        from spak.attention.problems import expand
        cs = {"both": (False, True), "yes": (True,), "no": (False,)}[causal or self.causal]
        return expand(list(shapes if shapes is not None else self.shapes),
                      tuple(dtypes or self.dtypes), cs)

    @property
    def compile_variants(self) -> list[CompileVariant]:
        c = self.cpu.get("compile")
        return list(c["variants"]) if c else []

    @property
    def compile_archs(self) -> list[str]:
        c = self.cpu.get("compile")
        return list(c["archs"]) if c else []


@dataclasses.dataclass(frozen=True)
class Plan:
    path: Optional[Path]
    name: str
    title: str
    source: str
    targets: dict            # arch -> Target
    steps: tuple             # Step
    sweep: dict              # arch -> SweepSpace
    warnings: tuple = ()
    raw: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def archs(self) -> list[str]:
        return list(self.targets)

    def step(self, step_id: str) -> Step:
        for s in self.steps:
            if s.id == step_id:
                return s
        raise KeyError(f"no step {step_id!r} in plan {self.name!r}; steps: "
                       f"{', '.join(s.id for s in self.steps)}")

    def sweep_space(self, arch: str) -> SweepSpace:
        """The sweeper's search space for `arch` (KeyError naming the archs that have one)."""
        try:
            return self.sweep[arch]
        except KeyError:
            raise KeyError(f"plan {self.name!r} has no sweep space for {arch!r}; it has: "
                           f"{', '.join(self.sweep) or 'none'}") from None

    def kernel_variants(self, archs=None) -> list[tuple[str, str, CompileVariant]]:
        """(kernel, arch, variant) for every compile variant named by any step, deduplicated."""
        seen: dict = {}
        for s in self.steps:
            for arch in s.compile_archs:
                if archs is not None and arch not in archs:
                    continue
                for v in s.compile_variants:
                    seen.setdefault((s.kernel, arch, v), None)
        return list(seen)


# ---------------------------------------------------------------- validation core

def _tname(v) -> str:
    if isinstance(v, bool):
        return "a boolean"
    return {int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "a table"}.get(type(v), type(v).__name__)


class _V:
    """Collects errors; each check returns the value (or None when it is wrong)."""

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

    def lst(self, path, v, item, nonempty=True):
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


# ------------------------------------------------------------------- lazy facts

def _known_kernels() -> tuple[str, ...]:
    try:
        from spak.gpu.plan import KERNELS
        return tuple(KERNELS)
    except Exception:  # noqa: BLE001 -- cuTile missing: the kernels' names are still these
        return ("fused", "naive")


def _known_models() -> tuple[str, ...]:
    try:
        from spak.sim.numerics import MODELS
        return tuple(MODELS)
    except Exception:  # noqa: BLE001
        return ("sm_90", "sm_120", "ieee")


def _check_shape(v: _V, path: str, text):
    from spak.attention.problems import SHAPE_SETS, ShapeError, parse_case
    s = v.string(path, text)
    if s is None:
        return None
    item = s.strip()
    if item.lower() in SHAPE_SETS:
        return item
    if "," in item:
        return v.err(path, f"{s!r}: one shape or set per list item (no commas)")
    try:
        dims, _ = parse_case(item)
    except ShapeError as e:
        if "x" not in item.lower():
            return v.err(path, f"{s!r} is neither a shape set ({', '.join(SHAPE_SETS)}) nor a "
                               f"shape such as 1x8x128x64")
        return v.err(path, str(e))
    if dims["D"] > MAX_HEAD_DIM:
        return v.err(path, f"{s!r}: head dim {dims['D']} is above {MAX_HEAD_DIM}")
    return item


# --------------------------------------------------------------------- the schema

_TOP = {"schema", "name", "title", "source", "targets", "steps", "sweep"}
_TARGET = {"gpus", "sim_model", "note"}
_STEP = {"id", "title", "kind", "kernel", "shapes", "sim_shapes", "dtypes", "causal", "models",
         "tiles", "seed", "gates", "note"}
_CPU = {"prototype": {"max_abs"},
        "kernel": {"rel_l2", "nonfinite", "checker", "compile"},
        "sweep": {"rel_l2", "nonfinite", "checker", "compile"}}
_GPU = {"kernel": {"shapes", "dtypes", "causal", "rel_l2", "nonfinite", "sim_agreement",
                   "timed_shapes", "timed_dtype", "tflops"},
        # the sweeper checks each config's result itself (vs SDPA) and records failures
        "sweep": {"shapes", "dtypes", "causal", "tflops", "tuned_vs_default"}}
_FLOOR = {"arch", "floor", "verified", "source", "head_dim", "min_seq", "causal", "dtype"}
_VARIANT = {"dtype", "head_dim", "causal", "mask", "tiles"}
_SWEEP = {"TILE_M", "TILE_N", "occupancy", "num_ctas", "max_tile", "knobs", "note", "exclude"}


def _sim_agreement(v: _V, path, x):
    """A fraction in [0, 1] for every arch, or a table {arch: fraction}: each arch's
    simulator model is calibrated separately (sm_90 measured bit-exact, sm_120 not yet)."""
    from spak.device.archs import ARCHS
    if not isinstance(x, dict):
        return v.number(path, x, 0.0, 1.0)
    out = {}
    for arch, val in x.items():
        if arch not in ARCHS:
            v.err(f"{path}.{arch}", f"unknown arch {arch!r}; known archs: {', '.join(ARCHS)}")
            continue
        n = v.number(f"{path}.{arch}", val, 0.0, 1.0)
        if n is not None:
            out[arch] = n
    return out


def sim_agreement_for(gate, arch: str) -> float:
    """The sim_agreement threshold for ``arch``: a table's entry (0 when the arch is not
    listed: measured and recorded only), or the one number for every arch."""
    return gate.get(arch, 0.0) if isinstance(gate, dict) else gate


def _rel_l2(v: _V, path, x):
    t = v.table(path, x, set(DTYPES))
    if t is None:
        return None
    out = {}
    for k, val in t.items():
        if k in DTYPES:
            n = v.number(f"{path}.{k}", val, positive=True)
            if n is not None:
                out[k] = n
    return out


def _tiles(v: _V, path, x, limits: dict):
    """Validate {"TILE_M", "TILE_N"} against the global bounds and each arch's max_tile."""
    t = v.table(path, x, {"TILE_M", "TILE_N"}, required=("TILE_M", "TILE_N"))
    if t is None:
        return None
    out = {}
    for k in ("TILE_M", "TILE_N"):
        if k not in t:
            continue
        n = v.tile(f"{path}.{k}", t[k])
        if n is None:
            continue
        for arch, mt in limits.items():
            if n > mt:
                v.err(f"{path}.{k}", f"{n} is larger than sweep.{arch}.max_tile ({mt}) allows "
                                     f"for target {arch}")
                n = None
                break
        if n is not None:
            out[k] = n
    return out if len(out) == 2 else None


def _targets(v: _V, raw) -> dict:
    from spak.device.archs import ARCHS, PROFILES
    t = v.table("targets", raw, set(ARCHS) | set(raw if isinstance(raw, dict) else ()))
    out = {}
    if t is None:
        return out
    if not t:
        v.err("targets", "must name at least one arch")
    models = _known_models()
    for arch, body in t.items():
        path = f"targets.{arch}"
        if arch not in ARCHS:
            v.err(path, f"unknown arch {arch!r}; known archs: {', '.join(ARCHS)}")
            continue
        b = v.table(path, body, _TARGET, required=("gpus",))
        if b is None:
            continue
        gpus = v.lst(f"{path}.gpus", b.get("gpus", []), lambda p, x: v.string(p, x)) or []
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


def _sweep(v: _V, raw, targets: dict) -> dict:
    from spak.device.archs import ARCHS
    out = {}
    if raw is None:
        return out
    t = v.table("sweep", raw, set(raw) if isinstance(raw, dict) else set())
    if t is None:
        return out
    for arch, body in t.items():
        path = f"sweep.{arch}"
        if arch not in ARCHS:
            v.err(path, f"unknown arch {arch!r}; known archs: {', '.join(ARCHS)}")
            continue
        if arch not in targets:
            v.err(path, f"{arch} is not in [targets] ({', '.join(targets) or 'none'})")
            continue
        b = v.table(path, body, _SWEEP, required=("TILE_M", "TILE_N", "occupancy", "num_ctas"))
        if b is None:
            continue
        mt = MAX_TILE
        if "max_tile" in b:
            mt = v.tile(f"{path}.max_tile", b["max_tile"]) or MAX_TILE
        lists = {}
        for k in ("TILE_M", "TILE_N"):
            if k in b:
                lists[k] = v.lst(f"{path}.{k}", b[k],
                                 lambda p, x: v.tile(p, x, mt, f"{path}.max_tile"))
        if "occupancy" in b:
            lists["occupancy"] = v.lst(f"{path}.occupancy", b["occupancy"],
                                       lambda p, x: v.integer(p, x, 1, 32))

        def cta(p, x, arch=arch):
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
        if "num_ctas" in b:
            lists["num_ctas"] = v.lst(f"{path}.num_ctas", b["num_ctas"], cta)
        for k, vals in lists.items():
            if vals is not None and len(set(vals)) != len(vals):
                v.err(f"{path}.{k}", f"duplicate values in {vals}")
        knobs = {}
        if "knobs" in b:
            kt = v.table(f"{path}.knobs", b["knobs"], set(b["knobs"]) if isinstance(
                b["knobs"], dict) else set())
            for name, vals in (kt or {}).items():
                r = v.lst(f"{path}.knobs.{name}", vals,
                          lambda p, x: x if isinstance(x, (int, float, str, bool)) else
                          v.err(p, f"expected a number, string or boolean, got {x!r}"))
                if r is not None:
                    knobs[name] = tuple(r)
        note = v.string(f"{path}.note", b["note"]) if "note" in b else ""
        exclude = _exclude(v, f"{path}.exclude", b["exclude"], {**lists, **knobs}) \
            if "exclude" in b else ()
        if all(lists.get(k) for k in ("TILE_M", "TILE_N", "occupancy", "num_ctas")) \
                and exclude is not None:
            sp = SweepSpace(arch, *(tuple(lists[k]) for k in
                                    ("TILE_M", "TILE_N", "occupancy", "num_ctas")),
                            max_tile=mt, knobs=knobs, note=note or "", exclude=exclude)
            if not sp.configs():
                v.err(f"{path}.exclude", "excludes every config of the space")
            out[arch] = sp
    return out


def _exclude(v: _V, path, raw, lists: dict):
    """[sweep.<arch>].exclude: a list of tables, each naming keys of the space (TILE_M,
    TILE_N, occupancy, num_ctas or a knob) with one of that key's values. Returns a tuple
    of sorted (key, value) tuples, or None after an error."""
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
    r = v.lst(path, raw, one)
    return None if r is None else tuple(r)


def _variants(v: _V, path, raw, limits):
    def one(p, x):
        b = v.table(p, x, _VARIANT, required=("dtype", "head_dim"))
        if b is None:
            return None
        dt = v.string(f"{p}.dtype", b.get("dtype"), DTYPES) if "dtype" in b else None
        d = v.integer(f"{p}.head_dim", b.get("head_dim"), 1, MAX_HEAD_DIM) if "head_dim" in b \
            else None
        c = v.boolean(f"{p}.causal", b["causal"]) if "causal" in b else False
        m = v.boolean(f"{p}.mask", b["mask"]) if "mask" in b else False
        tiles = _tiles(v, f"{p}.tiles", b["tiles"], limits) if "tiles" in b else None
        if None in (dt, d, c, m) or ("tiles" in b and tiles is None):
            return None
        return CompileVariant(dt, d, c, m, tuple(sorted(tiles.items())) if tiles else None)
    return v.lst(path, raw, one)


def _floors(v: _V, path, raw, targets):
    def one(p, x):
        b = v.table(p, x, _FLOOR, required=("arch", "floor", "verified", "source"))
        if b is None:
            return None
        arch = v.string(f"{p}.arch", b.get("arch")) if "arch" in b else None
        if arch is not None and arch not in targets:
            v.err(f"{p}.arch", f"{arch!r} is not in [targets] ({', '.join(targets)})")
            arch = None
        floor = v.number(f"{p}.floor", b.get("floor"), positive=True) if "floor" in b else None
        ver = v.boolean(f"{p}.verified", b.get("verified")) if "verified" in b else None
        src = v.string(f"{p}.source", b.get("source")) if "source" in b else None
        d = v.integer(f"{p}.head_dim", b["head_dim"], 1, MAX_HEAD_DIM) if "head_dim" in b \
            else None
        ms = v.integer(f"{p}.min_seq", b["min_seq"], 1) if "min_seq" in b else None
        c = v.boolean(f"{p}.causal", b["causal"]) if "causal" in b else None
        dt = v.string(f"{p}.dtype", b["dtype"], DTYPES) if "dtype" in b else "fp16"
        if None in (arch, floor, ver, src, dt):
            return None
        if ("head_dim" in b and d is None) or ("min_seq" in b and ms is None) or \
                ("causal" in b and c is None):
            return None
        return TflopsFloor(arch, floor, ver, src, d, ms, c, dt)
    return v.lst(path, raw, one, nonempty=False)


def _step(v: _V, i: int, raw, targets: dict, sweep_limits: dict) -> Optional[Step]:
    path = f"steps[{i}]"
    b = v.table(path, raw, _STEP, required=("id", "title", "kind"))
    if b is None:
        return None
    sid = v.string(f"{path}.id", b.get("id")) if "id" in b else None
    if sid is not None and not _ID_RE.match(sid):
        v.err(f"{path}.id", f"{sid!r} must be lower-case letters, digits, '-' or '_', "
                            f"starting with a letter")
    title = v.string(f"{path}.title", b.get("title")) if "title" in b else None
    kind = v.string(f"{path}.kind", b.get("kind"), KINDS) if "kind" in b else None
    kernel = None
    if kind in ("kernel", "sweep"):
        if "kernel" not in b:
            v.err(f"{path}.kernel", f"missing (required for kind {kind!r})")
        else:
            kernels = _known_kernels()
            kernel = v.string(f"{path}.kernel", b["kernel"])
            if kernel is not None and kernel not in kernels:
                v.err(f"{path}.kernel", f"unknown kernel {kernel!r}; known kernels: "
                                        f"{', '.join(kernels)}")
                kernel = None
        if "shapes" not in b:
            v.err(f"{path}.shapes", f"missing (required for kind {kind!r})")
    elif kind == "prototype":
        for k in ("kernel", "shapes", "sim_shapes", "dtypes", "causal", "models", "tiles"):
            if k in b:
                v.err(f"{path}.{k}", "not used by a prototype step")
    if "sim_shapes" in b and kind != "sweep":
        v.err(f"{path}.sim_shapes", "only a sweep step has sim_shapes")
    shapes = v.lst(f"{path}.shapes", b["shapes"], lambda p, x: _check_shape(v, p, x)) \
        if "shapes" in b else []
    sim_shapes = v.lst(f"{path}.sim_shapes", b["sim_shapes"],
                       lambda p, x: _check_shape(v, p, x)) if "sim_shapes" in b else []
    dtypes = v.lst(f"{path}.dtypes", b["dtypes"], lambda p, x: v.string(p, x, DTYPES)) \
        if "dtypes" in b else list(DTYPES)
    causal = v.string(f"{path}.causal", b["causal"], CAUSAL) if "causal" in b else "both"
    models = v.lst(f"{path}.models", b["models"],
                   lambda p, x: v.string(p, x, _known_models())) if "models" in b else ["sm_90"]
    tiles = _tiles(v, f"{path}.tiles", b["tiles"], sweep_limits) if "tiles" in b else None
    seed = v.integer(f"{path}.seed", b["seed"], 0) if "seed" in b else 0

    cpu, gpu = {}, {}
    g = v.table(f"{path}.gates", b.get("gates", {}), {"cpu", "gpu"})
    if g is not None and kind in KINDS:
        cpu = _cpu_gates(v, f"{path}.gates.cpu", g.get("cpu"), kind, targets, sweep_limits)
        if "gpu" in g:
            if kind == "prototype":
                v.err(f"{path}.gates.gpu", "a prototype step has no GPU gates")
            else:
                gpu = _gpu_gates(v, f"{path}.gates.gpu", g["gpu"], kind, targets)
    if None in (sid, title, kind) or (kind in ("kernel", "sweep") and kernel is None):
        return None
    return Step(index=i, id=sid, title=title, kind=kind, kernel=kernel,
                shapes=tuple(shapes or ()), sim_shapes=tuple(sim_shapes or ()),
                dtypes=tuple(dtypes or DTYPES), causal=causal or "both",
                models=tuple(models or ("sm_90",)), tiles=tiles, seed=seed or 0,
                cpu=cpu or {}, gpu=gpu or {})


def _cpu_gates(v: _V, path, raw, kind, targets, limits) -> dict:
    if raw is None:
        v.err(path, "missing: every step has CPU gates")
        return {}
    b = v.table(path, raw, _CPU[kind])
    if b is None:
        return {}
    out: dict[str, Any] = {}
    if kind == "prototype":
        if "max_abs" not in b:
            v.err(f"{path}.max_abs", "missing (required)")
        else:
            out["max_abs"] = v.number(f"{path}.max_abs", b["max_abs"], positive=True)
        return out
    if "rel_l2" not in b:
        v.err(f"{path}.rel_l2", "missing (required)")
    else:
        out["rel_l2"] = _rel_l2(v, f"{path}.rel_l2", b["rel_l2"])
    out["nonfinite"] = v.integer(f"{path}.nonfinite", b["nonfinite"], 0) \
        if "nonfinite" in b else 0
    out["checker"] = v.boolean(f"{path}.checker", b["checker"]) if "checker" in b else True
    if "compile" in b:
        cp = f"{path}.compile"
        c = v.table(cp, b["compile"], {"archs", "variants"}, required=("archs", "variants"))
        if c is not None:
            archs = v.lst(f"{cp}.archs", c.get("archs", []),
                          lambda p, x: x if v.string(p, x) is not None and x in targets else
                          (v.err(p, f"{x!r} is not in [targets] ({', '.join(targets)})")
                           if isinstance(x, str) else None))
            variants = _variants(v, f"{cp}.variants", c.get("variants", []),
                                 {a: limits[a] for a in (archs or []) if a in limits})
            if archs and variants:
                out["compile"] = {"archs": archs, "variants": variants}
    return out


def _gpu_gates(v: _V, path, raw, kind, targets) -> dict:
    b = v.table(path, raw, _GPU[kind])
    if b is None:
        return {}
    out: dict[str, Any] = {}
    if "shapes" in b:
        out["shapes"] = v.lst(f"{path}.shapes", b["shapes"], lambda p, x: _check_shape(v, p, x))
    if "dtypes" in b:
        out["dtypes"] = v.lst(f"{path}.dtypes", b["dtypes"], lambda p, x: v.string(p, x, DTYPES))
    if "causal" in b:
        out["causal"] = v.string(f"{path}.causal", b["causal"], CAUSAL)
    if "rel_l2" in b:
        out["rel_l2"] = _rel_l2(v, f"{path}.rel_l2", b["rel_l2"])
    if "nonfinite" in b:
        out["nonfinite"] = v.integer(f"{path}.nonfinite", b["nonfinite"], 0)
    if "sim_agreement" in b:
        out["sim_agreement"] = _sim_agreement(v, f"{path}.sim_agreement", b["sim_agreement"])
    if "timed_shapes" in b:
        out["timed_shapes"] = v.lst(f"{path}.timed_shapes", b["timed_shapes"],
                                    lambda p, x: _check_shape(v, p, x))
    if "timed_dtype" in b:
        out["timed_dtype"] = v.string(f"{path}.timed_dtype", b["timed_dtype"], DTYPES)
    if "tflops" in b:
        out["tflops"] = _floors(v, f"{path}.tflops", b["tflops"], targets)
    if "tuned_vs_default" in b:
        out["tuned_vs_default"] = v.number(f"{path}.tuned_vs_default", b["tuned_vs_default"],
                                           positive=True)
    return out


def _warn_floors(v: _V, steps, targets):
    """A floor above the peak of every GPU of its arch cannot be met: say so (not an error)."""
    from spak.device.archs import PROFILES, peak_tflops
    for s in steps:
        for j, f in enumerate(s.gpu.get("tflops") or ()):
            gpus = targets[f.arch].gpus if f.arch in targets else ()
            peaks = [peak_tflops(PROFILES[g], f.dtype) for g in gpus if g in PROFILES]
            if peaks and f.floor > max(peaks):
                v.warnings.append(
                    f"steps[{s.index}].gates.gpu.tflops[{j}]: floor {f.floor:g} TFLOPS exceeds "
                    f"the {f.arch} peak dense {f.dtype} tensor rate with fp32 accumulate "
                    f"({max(peaks):g}, spak.device.archs){'' if f.verified else '; it is unverified'}")


def parse_plan(doc: dict, path: Optional[Path] = None) -> Plan:
    """Validate a parsed TOML document; returns a Plan or raises PlanError (all problems)."""
    v = _V()
    src = str(path) if path is not None else "plan"
    if not isinstance(doc, dict):
        raise PlanError([f"(top level): expected a table, got {_tname(doc)}"], src)
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
            for i, rs in enumerate(raw_steps):
                s = _step(v, i, rs, targets, limits)
                if s is not None:
                    steps.append(s)
    ids = [s.id for s in steps]
    for s in steps:
        if ids.count(s.id) > 1 and ids.index(s.id) != s.index:
            v.err(f"steps[{s.index}].id", f"duplicate step id {s.id!r}")
        if s.kind == "sweep":
            given = doc.get("sweep") if isinstance(doc.get("sweep"), dict) else {}
            for arch in targets:
                if arch not in given:       # present but invalid: already reported
                    v.err(f"sweep.{arch}", f"missing: step {s.id!r} sweeps on every target "
                                           f"arch, so [sweep.{arch}] is required")
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
