"""The sweep's jobs: one (problem, provider, config) each, in run order, with the compile
unit its cubin comes from and a modelled cost (for the ETA and ``--list``'s estimate).

Providers: "spak-<kernel>" a swept config, "spak-<kernel>-default" the family's default
config, and the family's sweep peers (e.g. "sdpa-cudnn"), timed once per problem.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Optional

from spak import families
from spak.tune.space import config_id

__all__ = ["Job", "provider_name", "plan_jobs", "attention_compile_unit",
           "job_seconds", "estimate_seconds"]


def provider_name(kernel: str, kind: str) -> str:
    """"config" -> "spak-<kernel>", "default" -> "spak-<kernel>-default", else "sdpa-<kind>"."""
    return {"config": f"spak-{kernel}", "default": f"spak-{kernel}-default"}.get(
        kind, f"sdpa-{kind}")


@dataclass(eq=False)         # identity: the queue removes jobs by identity, fast
class Job:
    kernel: str
    spec: Any                             # the family's problem
    provider: str
    config_id: str
    config: Optional[dict]
    unit: Optional[dict] = None           # compile unit (None: a peer or not precompilable)
    family: str = families.DEFAULT
    flops: float = 0.0                    # of one call, by the family's convention
    #: with --gpus, the GPU (CUDA_VISIBLE_DEVICES entry) that must run this copy of the job:
    #: a shape's peers and default timed again on a GPU that helps with its configs, or a
    #: job retried on another GPU after a worker fault (spak.tune.slots)
    pin: Optional[str] = None

    @cached_property
    def case(self) -> str:
        # cached: the scheduler asks every queued job's case on each dispatch (756 jobs x
        # 4 GPUs: ~0.6 M formatted ids a sweep when computed each time)
        return self.spec.case_id

    @property
    def key(self) -> tuple:
        return (self.case, self.provider, self.config_id)

    @property
    def anchor(self) -> bool:
        """A peer or the default config: what the swept configs of its shape are compared
        with, so it is timed on every GPU that times configs of the shape."""
        return self.config is None or self.config_id == "default"

    def payload(self) -> dict:
        """The job as the worker receives it (the "job" op of spak.tune.worker)."""
        return {"family": self.family, "kernel": self.kernel, "case": self.case,
                "provider": self.provider, "config_id": self.config_id,
                "config": self.config, "flops": self.flops,
                **({"unit_id": self.unit["unit_id"]} if self.unit else {})}


def plan_jobs(kernel: str, specs, configs, *, arch: str = "sm_90", default: bool = True,
              peers=None, family=None) -> list[Job]:
    """Every job, in run order: the peers per problem first (no compile: they run while the
    helpers compile), then the default config per problem, then config by config over the
    problems (consecutive jobs share a compiled variant). ``peers``: provider names
    (default: the family's sweep_peers)."""
    fam = families.get(family) if family is None or isinstance(family, str) else family
    peers = fam.sweep_peers if peers is None else peers
    keys = fam.space_keys

    def job(spec, provider, cid, cfg, unit=None):
        if unit is not None:                 # the compile helper builds it through the family
            unit = {**unit, "family": fam.name}
        return Job(kernel, spec, provider, cid, cfg, unit, fam.name, fam.flops(spec))
    jobs = [job(spec, name, "-", None) for spec in specs for name in peers]
    if default:
        for spec in specs:
            base = fam.default_config(spec, arch)
            cfg = {**base, **{k: None for k in keys if k not in base}}
            jobs.append(job(spec, provider_name(kernel, "default"), "default", cfg,
                            fam.compile_unit(kernel, spec, cfg, "default")))
    for cfg in configs:
        cid = config_id(cfg, keys)
        for spec in specs:
            jobs.append(job(spec, provider_name(kernel, "config"), cid, dict(cfg),
                            fam.compile_unit(kernel, spec, cfg, cid)))
    return jobs


# ------------------------------------------------------------------ compile units

def _spec_bits(shape, elem_bytes: int) -> str:
    """What ct.launch specialises a contiguous array on, per dimension: extent divisible
    by 16 (d), stride 16-byte divisible (s), stride 1 (1); e.g. "ds.ds.ds.d-1". An extent
    of 1 is its own class ("u"): torch hands such a dimension over with a normalised
    stride, and on an H200 B=1 compiled a cubin of its own where B=2, 4, 8 shared one
    (results/run-nvidia-h200-2026-11-22.jsonl.gz, first_call_s)."""
    out, stride = [], 1
    for d in reversed(shape):
        if d == 1:
            out.append("u")
        else:
            out.append(("d" if d % 16 == 0 else "-")
                       + ("s" if stride * elem_bytes % 16 == 0 else "-")
                       + ("1" if stride == 1 else ""))
        stride *= d
    return ".".join(reversed(out))


def attention_compile_unit(kernel: str, spec, cfg: dict, cid: str) -> Optional[dict]:
    """What cuTile compiles one attention-forward cubin for, as small arrays with the same
    JIT specialisation (spak.tune.worker.tiny_dim on every extent but the head dim), or
    None when the tiny stand-ins cannot mirror the launch (int64 indexing past 2^31
    elements, a GQA ratio the tiny head counts break)."""
    from spak.tune.worker import tiny_dim
    big = max(math.prod(spec.q_shape), math.prod(spec.kv_shape),
              spec.B * spec.Hq * spec.Sq * spec.Sk if kernel == "naive" else 0)
    if big > 2 ** 31 - 1:
        return None
    # B, heads and sequence lengths shrink; the head dim stays: the kernels' HEAD_DIM
    # Constant (a compile-time value) is derived from it.
    q = [tiny_dim(d) for d in spec.q_shape[:3]] + [spec.D]
    k = [tiny_dim(d) for d in spec.kv_shape[:3]] + [spec.D]
    if q[1] % k[1]:
        return None
    arrays = [spec.q_shape, spec.kv_shape]
    if kernel == "naive":
        arrays.append((spec.B, spec.Hq, spec.Sq, spec.Sk))
    bits = "|".join(_spec_bits(a, 2) for a in arrays)
    uid = (f"{kernel}|{cid}|{spec.dtype}|D{spec.D}|{'causal' if spec.causal else 'noncausal'}|"
           f"{bits}")
    return {"unit_id": uid, "kernel": kernel, "config_id": cid, "config": cfg,
            "dtype": spec.dtype, "causal": spec.causal, "q": q, "k": k, "case": spec.case_id}


# ------------------------------------------------------------------ estimates

def job_seconds(job: Job, timing: Optional[dict] = None, tflops: float = 300.0) -> float:
    """Modelled seconds of one job without its compile: warm-up and estimate calls, the
    timed batches (each at least batch_ms), ~60 ms for inputs, reference and check."""
    t = {"warmup": 3, "batches": 5, "batch_ms": 40.0, **(timing or {})}
    call = job.flops / (tflops * 1e12)
    return (t["warmup"] + 1) * call + t["batches"] * max(call, t["batch_ms"] / 1e3) + 0.06


def estimate_seconds(jobs: list[Job], *, compile_jobs: int, compile_s: float = 3.0,
                     tflops: float = 300.0, timing: Optional[dict] = None,
                     workers: int = 1) -> dict:
    """A rough, conservative wall-clock estimate: each job's calls (warm-up, estimate,
    batches of ~batch_ms each) at ``tflops``, ~60 ms of overhead (inputs, check), plus
    the compiles (``compile_s`` each, twice the 1.2-1.8 s first calls seen on an H200,
    spread over the helpers, ~0.3 s each for the worker's cache hit), added as if they
    did not overlap the timing (they mostly do). ``workers`` GPUs share the timing."""
    run_s = sum(job_seconds(j, timing, tflops) for j in jobs) / max(1, workers)
    units = {j.unit["unit_id"] for j in jobs if j.unit}
    n_units = len(units) + sum(1 for j in jobs if j.unit is None and j.config is not None)
    compile_total = n_units * compile_s
    if compile_jobs > 0:
        compile_wall = compile_total / compile_jobs + 10.0 + n_units * 0.3
    else:
        compile_wall = compile_total
    return {"jobs": len(jobs), "compile_units": n_units, "run_s": run_s,
            "compile_s": compile_wall, "startup_s": 15.0,
            "total_s": run_s + compile_wall + 15.0}
