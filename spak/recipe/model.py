"""A plan as data: the validated objects `spak.recipe.schema.load_plan` returns.

A `Plan` holds its target archs (`Target`), its steps in order (`Step`, each with the
kernel family it belongs to, its shapes and its CPU and GPU gates), and one sweep space per
arch (`SweepSpace`). Everything here is already checked; nothing here reads files.
"""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Optional

from spak.results.rows import tiles_label

__all__ = ["PlanError", "Plan", "Step", "Target", "SweepSpace", "ThroughputFloor",
           "CompileVariant", "excluded", "sim_agreement_for", "tiles_label",
           "SCHEMA_VERSION", "DEFAULT_PLAN", "KINDS", "DTYPES", "CAUSAL", "MIN_TILE",
           "MAX_TILE"]

SCHEMA_VERSION = 1
DEFAULT_PLAN = Path(__file__).resolve().parents[2] / "plans" / "fmha.toml"
KINDS = ("prototype", "kernel", "sweep")
DTYPES = ("fp16", "bf16")
CAUSAL = ("yes", "no", "both")
MIN_TILE, MAX_TILE = 16, 256          # gpu.plan's bounds (powers of two)


class PlanError(ValueError):
    """A plan that cannot be used; `.errors` lists every problem ("path: message")."""

    def __init__(self, errors, source: str = "plan"):
        self.errors = list(errors)
        self.source = source
        n = len(self.errors)
        head = f"{source}: {n} problem{'s' if n != 1 else ''}"
        super().__init__(head + ":\n  " + "\n  ".join(self.errors))


def excluded(cfg: dict, exclude) -> bool:
    """Whether config ``cfg`` matches every key of some entry of ``exclude`` (a sequence of
    dicts or of (key, value) pairs)."""
    return any(all(cfg.get(k) == v for k, v in dict(e).items()) for e in exclude)


def sim_agreement_for(gate, arch: str) -> float:
    """The sim_agreement threshold for ``arch``: a table's entry (0 when the arch is not
    listed: measured and recorded only), or the one number for every arch."""
    return gate.get(arch, 0.0) if isinstance(gate, dict) else gate


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
            s += " " + tiles_label(self.tiles)
        return s


@dataclasses.dataclass(frozen=True)
class ThroughputFloor:
    """A minimum throughput (in the family's metric: TFLOPS or GB/s) on one arch, for the
    timed problems its selectors match."""
    arch: str
    floor: float
    verified: bool
    source: str
    head_dim: Optional[int] = None
    min_seq: Optional[int] = None
    causal: Optional[bool] = None
    dtype: str = "fp16"

    def applies(self, problem) -> bool:
        """Does this floor judge `problem` (an attention problem: D, Sk, causal, dtype, mask)?"""
        return ((self.head_dim is None or problem.D == self.head_dim)
                and (self.min_seq is None or problem.Sk >= self.min_seq)
                and (self.causal is None or problem.causal == self.causal)
                and problem.dtype == self.dtype and problem.mask is None)

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
    """One arch's sweep space for one kernel family: a list of values per space key (the
    family's `space_keys`, e.g. TILE_M, TILE_N, occupancy, num_ctas), kernel knobs, and
    partial configs to leave out. Each space key is also an attribute (``space.TILE_M``)."""
    arch: str
    lists: dict                       # space key -> tuple of values, in the family's order
    max_tile: int = MAX_TILE
    knobs: dict = dataclasses.field(default_factory=dict)
    note: str = ""
    #: partial configs to leave out: a config matching every key of one entry is skipped
    exclude: tuple = ()
    family: str = "fmha_fwd"

    def __getattr__(self, key):
        lists = self.__dict__.get("lists") or {}
        if key in lists:
            return lists[key]
        raise AttributeError(f"sweep space {self.__dict__.get('arch')!r} has no {key!r}")

    def configs(self) -> list[dict]:
        """The cross product less the excluded, as dicts {space keys..., knobs...}."""
        names = [*self.lists, *self.knobs]
        values = [*self.lists.values(), *self.knobs.values()]
        return [c for c in (dict(zip(names, combo)) for combo in itertools.product(*values))
                if not excluded(c, self.exclude)]

    def tile_configs(self) -> list[dict]:
        """Every combination of the tile sizes alone (e.g. {"TILE_M": 64, "TILE_N": 128}),
        in the space's order: what the CPU gates simulate."""
        from spak import families
        keys = families.get(self.family).tile_keys
        return [dict(zip(keys, combo))
                for combo in itertools.product(*(self.lists[k] for k in keys))]

    def as_dict(self) -> dict:
        return {**{k: list(v) for k, v in self.lists.items()}, "max_tile": self.max_tile,
                "knobs": {k: list(v) for k, v in self.knobs.items()},
                "exclude": [dict(e) for e in self.exclude]}


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
    family: str = "fmha_fwd"

    @property
    def name(self) -> str:
        return f"step {self.index + 1} ({self.id})"

    @property
    def kernel_family(self):
        """The step's KernelFamily object."""
        from spak import families
        return families.get(self.family)

    def cases(self, shapes=None, dtypes=None, causal=None) -> list:
        """The step's shapes expanded to problems of its family, in order, without
        duplicates; open dtypes and causal flags expand over the step's (or those given)."""
        dts = set(dtypes or self.dtypes)
        dtype = "all" if dts >= set(DTYPES) else next(iter(dts))
        return self.kernel_family.select(list(shapes if shapes is not None else self.shapes),
                                         dtype=dtype, causal=causal or self.causal)

    @property
    def floors(self) -> tuple:
        """The step's throughput floors (ThroughputFloor), in the family's metric."""
        from spak.results.rows import metric_field
        return tuple(self.gpu.get(metric_field(self.kernel_family.metric)) or ())

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

    @property
    def families(self) -> list[str]:
        """The kernel families the plan's steps belong to, in step order."""
        return list(dict.fromkeys(s.family for s in self.steps))

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

    def only_family(self, family: Optional[str]) -> "Plan":
        """This plan with only the steps of one kernel family (None: all of them)."""
        if family is None:
            return self
        return dataclasses.replace(self, steps=tuple(s for s in self.steps
                                                     if s.family == family))
