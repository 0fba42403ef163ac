"""The ``[[steps]]`` tables of a plan file, validated: each step's family, kernel,
shapes, tiles and its CPU and GPU gates (`parse_step`), through the step's kernel family
(its kernels, shape grammar, tile keys and metric)."""
from __future__ import annotations

import re
from typing import Any, Optional

from spak.recipe.fields import FieldChecker, known_models
from spak.recipe.model import CAUSAL, DTYPES, KINDS, CompileVariant, Step, ThroughputFloor

__all__ = ["parse_step"]

_ID_RE = re.compile(r"^[a-z][a-z0-9_-]*$")
_STEP = {"id", "title", "kind", "family", "kernel", "shapes", "sim_shapes", "dtypes", "causal",
         "models", "tiles", "seed", "gates", "note"}
_CPU = {"prototype": {"max_abs"},
        "kernel": {"rel_l2", "nonfinite", "checker", "compile"},
        "sweep": {"rel_l2", "nonfinite", "checker", "compile"}}
# besides these, a step's throughput floors, under its family's metric field (tflops, gbps)
_GPU = {"kernel": {"shapes", "dtypes", "causal", "rel_l2", "nonfinite", "sim_agreement",
                   "timed_shapes", "timed_dtype"},
        # the sweeper checks each config's result itself (vs SDPA) and records failures
        "sweep": {"shapes", "dtypes", "causal", "tuned_vs_default"}}
_FLOOR = {"arch", "floor", "verified", "source", "head_dim", "min_seq", "causal", "dtype"}
_VARIANT = {"dtype", "head_dim", "causal", "mask", "tiles"}
_MAX_HEAD_DIM = 256


def _rel_l2(v: FieldChecker, path, x):
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


def _tiles(v: FieldChecker, path, x, limits: dict, keys=("TILE_M", "TILE_N")):
    """Validate a tile table (every tile key of the family) against the global bounds and
    each arch's max_tile."""
    t = v.table(path, x, set(keys), required=keys)
    if t is None:
        return None
    out = {}
    for k in keys:
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
    return out if len(out) == len(keys) else None


def _sim_agreement(v: FieldChecker, path, x):
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


def _variants(v: FieldChecker, path, raw, limits, keys):
    def one(p, x):
        b = v.table(p, x, _VARIANT, required=("dtype", "head_dim"))
        if b is None:
            return None
        dt = v.string(f"{p}.dtype", b.get("dtype"), DTYPES) if "dtype" in b else None
        d = v.integer(f"{p}.head_dim", b.get("head_dim"), 1, _MAX_HEAD_DIM) \
            if "head_dim" in b else None
        c = v.boolean(f"{p}.causal", b["causal"]) if "causal" in b else False
        m = v.boolean(f"{p}.mask", b["mask"]) if "mask" in b else False
        tiles = _tiles(v, f"{p}.tiles", b["tiles"], limits, keys) if "tiles" in b else None
        if None in (dt, d, c, m) or ("tiles" in b and tiles is None):
            return None
        return CompileVariant(dt, d, c, m, tuple(sorted(tiles.items())) if tiles else None)
    return v.items(path, raw, one)


def _floors(v: FieldChecker, path, raw, targets):
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
        d = v.integer(f"{p}.head_dim", b["head_dim"], 1, _MAX_HEAD_DIM) if "head_dim" in b \
            else None
        ms = v.integer(f"{p}.min_seq", b["min_seq"], 1) if "min_seq" in b else None
        c = v.boolean(f"{p}.causal", b["causal"]) if "causal" in b else None
        dt = v.string(f"{p}.dtype", b["dtype"], DTYPES) if "dtype" in b else "fp16"
        if None in (arch, floor, ver, src, dt):
            return None
        if ("head_dim" in b and d is None) or ("min_seq" in b and ms is None) or \
                ("causal" in b and c is None):
            return None
        return ThroughputFloor(arch, floor, ver, src, d, ms, c, dt)
    return v.items(path, raw, one, nonempty=False)


def _step_kernel(v: FieldChecker, path: str, b: dict, kind, fam) -> Optional[str]:
    """The kernel of a kernel/sweep step (one of its family's), or None."""
    if kind in ("kernel", "sweep"):
        kernel = None
        if "kernel" not in b:
            v.err(f"{path}.kernel", f"missing (required for kind {kind!r})")
        else:
            kernel = v.string(f"{path}.kernel", b["kernel"])
            if kernel is not None and kernel not in fam.kernels:
                v.err(f"{path}.kernel", f"unknown kernel {kernel!r}; known kernels: "
                                        f"{', '.join(fam.kernels)}")
                kernel = None
        if "shapes" not in b:
            v.err(f"{path}.shapes", f"missing (required for kind {kind!r})")
        return kernel
    if kind == "prototype":
        for k in ("kernel", "shapes", "sim_shapes", "dtypes", "causal", "models", "tiles"):
            if k in b:
                v.err(f"{path}.{k}", "not used by a prototype step")
    return None


def parse_step(v: FieldChecker, i: int, raw, targets: dict, sweep_limits: dict) -> Optional[Step]:
    """steps[i]: a Step of its kernel family, or None after recording its problems."""
    path = f"steps[{i}]"
    b = v.table(path, raw, _STEP, required=("id", "title", "kind"))
    if b is None:
        return None
    fam = v.family(f"{path}.family", b)
    if fam is None:
        return None
    sid = v.string(f"{path}.id", b.get("id")) if "id" in b else None
    if sid is not None and not _ID_RE.match(sid):
        v.err(f"{path}.id", f"{sid!r} must be lower-case letters, digits, '-' or '_', "
                            f"starting with a letter")
    title = v.string(f"{path}.title", b.get("title")) if "title" in b else None
    kind = v.string(f"{path}.kind", b.get("kind"), KINDS) if "kind" in b else None
    kernel = _step_kernel(v, path, b, kind, fam)
    if "sim_shapes" in b and kind != "sweep":
        v.err(f"{path}.sim_shapes", "only a sweep step has sim_shapes")

    def shape_list(key):
        return v.items(f"{path}.{key}", b[key], lambda p, x: v.shape(p, x, fam)) \
            if key in b else []
    shapes, sim_shapes = shape_list("shapes"), shape_list("sim_shapes")
    dtypes = v.items(f"{path}.dtypes", b["dtypes"], lambda p, x: v.string(p, x, DTYPES)) \
        if "dtypes" in b else list(DTYPES)
    causal = v.string(f"{path}.causal", b["causal"], CAUSAL) if "causal" in b else "both"
    models = v.items(f"{path}.models", b["models"],
                     lambda p, x: v.string(p, x, known_models())) if "models" in b \
        else ["sm_90"]
    tkeys = fam.tile_keys
    tiles = _tiles(v, f"{path}.tiles", b["tiles"], sweep_limits, tkeys) if "tiles" in b \
        else None
    seed = v.integer(f"{path}.seed", b["seed"], 0) if "seed" in b else 0

    cpu, gpu = {}, {}
    g = v.table(f"{path}.gates", b.get("gates", {}), {"cpu", "gpu"})
    if g is not None and kind in KINDS:
        cpu = _cpu_gates(v, f"{path}.gates.cpu", g.get("cpu"), kind, targets, sweep_limits,
                         tkeys)
        if "gpu" in g:
            if kind == "prototype":
                v.err(f"{path}.gates.gpu", "a prototype step has no GPU gates")
            else:
                gpu = _gpu_gates(v, f"{path}.gates.gpu", g["gpu"], kind, targets, fam)
    if None in (sid, title, kind) or (kind in ("kernel", "sweep") and kernel is None):
        return None
    return Step(index=i, id=sid, title=title, kind=kind, kernel=kernel,
                shapes=tuple(shapes or ()), sim_shapes=tuple(sim_shapes or ()),
                dtypes=tuple(dtypes or DTYPES), causal=causal or "both",
                models=tuple(models or ("sm_90",)), tiles=tiles, seed=seed or 0,
                cpu=cpu or {}, gpu=gpu or {}, family=fam.name)


def _cpu_gates(v: FieldChecker, path, raw, kind, targets, limits, tkeys) -> dict:
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
            archs = v.items(f"{cp}.archs", c.get("archs", []),
                            lambda p, x: x if v.string(p, x) is not None and x in targets else
                            (v.err(p, f"{x!r} is not in [targets] ({', '.join(targets)})")
                             if isinstance(x, str) else None))
            variants = _variants(v, f"{cp}.variants", c.get("variants", []),
                                 {a: limits[a] for a in (archs or []) if a in limits}, tkeys)
            if archs and variants:
                out["compile"] = {"archs": archs, "variants": variants}
    return out


def _gpu_gates(v: FieldChecker, path, raw, kind, targets, fam) -> dict:
    from spak.results.rows import metric_field
    floor_key = metric_field(fam.metric)          # [[...gpu.tflops]] or [[...gpu.gbps]]
    b = v.table(path, raw, _GPU[kind] | {floor_key})
    if b is None:
        return {}
    out: dict[str, Any] = {}

    def shape_list(key):
        return v.items(f"{path}.{key}", b[key], lambda p, x: v.shape(p, x, fam))
    if "shapes" in b:
        out["shapes"] = shape_list("shapes")
    if "dtypes" in b:
        out["dtypes"] = v.items(f"{path}.dtypes", b["dtypes"],
                                lambda p, x: v.string(p, x, DTYPES))
    if "causal" in b:
        out["causal"] = v.string(f"{path}.causal", b["causal"], CAUSAL)
    if "rel_l2" in b:
        out["rel_l2"] = _rel_l2(v, f"{path}.rel_l2", b["rel_l2"])
    if "nonfinite" in b:
        out["nonfinite"] = v.integer(f"{path}.nonfinite", b["nonfinite"], 0)
    if "sim_agreement" in b:
        out["sim_agreement"] = _sim_agreement(v, f"{path}.sim_agreement", b["sim_agreement"])
    if "timed_shapes" in b:
        out["timed_shapes"] = shape_list("timed_shapes")
    if "timed_dtype" in b:
        out["timed_dtype"] = v.string(f"{path}.timed_dtype", b["timed_dtype"], DTYPES)
    if floor_key in b:
        out[floor_key] = _floors(v, f"{path}.{floor_key}", b[floor_key], targets)
    if "tuned_vs_default" in b:
        out["tuned_vs_default"] = v.number(f"{path}.tuned_vs_default", b["tuned_vs_default"],
                                           positive=True)
    return out
