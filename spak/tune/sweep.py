"""`spak sweep`: the manual tile sweeper (recipe step 4).

For one kernel, a set of shapes and the search space of the local GPU's arch (the plan
file's ``[sweep.<arch>]``, or ``--space``), every config is compiled, checked against
PyTorch SDPA and timed; TFLOPS per config are printed with a progress bar and an ETA and
the best config per shape is marked. The default tiles and SDPA's cuDNN and flash backends
are timed once per shape as well (for the report and the "tuned >= default" check).

Isolation. The configs run in a long-lived worker subprocess (spak/tune/worker.py); this
process only schedules, records and prints. A config that fails to compile, fails to
launch or gives a wrong result is recorded with its error by the worker; one that runs
past ``--timeout`` seconds, or that kills the worker, is recorded by this process (which
kills the worker's process group) and a fresh worker takes the remaining configs.

Results. One JSON line per (shape, provider, config), appended and flushed as each
finishes (schema "spak.sweep/2", see RESULT_FIELDS). ``--resume`` skips what the file
already holds for this GPU, so a killed sweep loses at most the config in flight.
``--budget-s`` stops cleanly before the wall-clock budget runs out (exit status 3: resume
to finish).

Compile time. cuTile compiles one cubin per (config, dtype, head dim, causal, and the
launch's specialisation: which extents are multiples of 16) on its first launch, ~2-20 s
each on a CPU. ``--compile-jobs N`` helper processes compile the coming variants ahead of
the worker, in parallel, by launching each once on tiny arrays of the same specialisation
(the cubins land in cuTile's disk cache, where the worker's own first launch finds them).

    spak sweep --shapes standard                       # the plan's space for this GPU
    spak sweep --shapes 4x16x2048x128/causal --space TILE_M=64 TILE_N=64,128 occupancy=1,2
    spak sweep --out results/sweep.jsonl --resume --budget-s 540 --update-store
    spak sweep --shapes standard --list --arch sm_90   # the jobs and a time estimate, no GPU
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from spak import __version__, families
from spak.results.jsonl import read_results, row_problem
from spak.results.provenance import slug
from spak.tune.jobs import Job, plan_jobs
from spak.tune.merge import merge_gpu_rows
from spak.tune.runner import SCHEMA, SCHEMAS_READ, format_seconds
from spak.tune.space import ROOT, describe_override, expand_space, load_space, tile_keys

__all__ = ["SCHEMA", "RESULT_FIELDS", "SweepPlan", "select_problems", "plan_sweep",
           "done_keys", "done_by_gpu", "anchors_by_gpu", "gpu_list", "auto_out_path",
           "auto_compile_jobs", "MAX_AUTO_COMPILE_JOBS", "visible_gpu_count", "run_env", "start_line", "end_line", "result_rows", "summarize", "list_lines", "header_text",
           "read_results"]

#: What a result line holds (kind == "result"). Lines of kind "start"/"end" frame each
#: invocation (options, space, counts); readers skip them.
RESULT_FIELDS = """\
schema, kind="result", sweep_id, date (UTC), gpu, arch, commit (git HEAD), dirty,
torch, cuda, cuda_tile, spak; family (kernel family; absent in schema /1: fmha_fwd),
kernel, case (the shape grammar's full id), shape, the family's problem fields (fmha: B,
Hq, Hkv, Sq, Sk, D), dtype, causal, flops; provider ("spak-<kernel>" swept config,
"spak-<kernel>-default" default tiles, "sdpa-cudnn", "sdpa-flash"), config_id, config
({TILE_M, TILE_N, occupancy, num_ctas}; null for SDPA); status (ok, compile_error,
launch_error, wrong_result, invalid_config, unsupported, oom, error, timeout, crash),
error; nonfinite, rel_l2_vs_sdpa, check_rtol; ms_median, ms_min, ms_max, ms_p25, ms_p75,
spread, runs, tflops; first_call_s (includes the compile), wall_s; host; with --gpus:
gpu_index (the worker's CUDA_VISIBLE_DEVICES entry), and after a worker fault attempts (2),
retried_after (the first attempt's failure) and retried_from (its GPU index)."""


def _utc(fmt: str = "%Y-%m-%dT%H:%M:%SZ") -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime(fmt)


# ------------------------------------------------------------------ what to run

def select_problems(fam, items, *, dtype: str, causal: str) -> tuple[list, list]:
    """(problems the sweep times, [(problem, why not)] for those it cannot), from set names
    and shape strings in the family's grammar (ShapeError for a bad one)."""
    problems, skipped = [], []
    for p in fam.select(items, dtype=dtype, causal=causal):
        why = fam.sweep_skip(p)
        if why:
            skipped.append((p, why))
        else:
            problems.append(p)
    return problems, skipped


@dataclass
class SweepPlan:
    space: dict
    source: str                # where the space came from
    configs: list[dict]
    jobs: list[Job]


def plan_sweep(fam, kernel: str, problems, arch: str, *, plan_path=None,
               override: Optional[dict] = None, default: bool = True,
               peers=None) -> SweepPlan:
    """The space for ``arch`` (the plan's, lists replaced by ``override``; ``override``
    alone when the family has no space for ``arch`` and it names every tile key), its
    configs and every job; ValueError when there is no space or it is empty."""
    override = override or {}
    try:
        space, src = load_space(plan_path, arch, fam)
    except ValueError:
        if plan_path or not all(k in override for k in tile_keys(fam.space_keys)):
            raise
        space, src = {}, "the command line"
    space.update(override)
    src += describe_override(override)
    configs = expand_space(space, fam)
    return SweepPlan(space, src, configs,
                     plan_jobs(kernel, problems, configs, arch=arch, default=default,
                               peers=peers, family=fam))


def _resumable(rows, kernel: str, retry_failed: bool, family: str):
    """The well-formed result rows of this family and kernel (peers' rows of any kernel),
    only the ok ones when ``retry_failed``: what --resume may skip."""
    for r in rows:
        if r.get("schema") not in SCHEMAS_READ or r.get("kind") != "result" \
                or r.get("family", families.DEFAULT) != family:
            continue
        if row_problem(r) or not all(isinstance(r.get(k), str)
                                     for k in ("case", "provider", "config_id")):
            continue                    # a malformed row is not "done": it runs again
        if r.get("kernel") != kernel and str(r.get("provider", "")).startswith("spak-"):
            continue
        if retry_failed and r.get("status") != "ok":
            continue
        yield r


def done_keys(rows, gpu: Optional[str], kernel: str, retry_failed: bool,
              family: str = families.DEFAULT) -> set:
    """(case, provider, config_id) of the rows --resume need not run again: this GPU's
    (``gpu`` None: any GPU's, as for a Ray cluster's sweep), this family's, this kernel's
    (peers' rows of any kernel), well-formed, and ok when ``retry_failed``."""
    return {(r["case"], r["provider"], r["config_id"])
            for r in _resumable(rows, kernel, retry_failed, family)
            if gpu is None or r.get("gpu") == gpu}


def done_by_gpu(rows, gpus: dict, kernel: str, retry_failed: bool,
                family: str = families.DEFAULT, host: Optional[str] = None) -> tuple[set, dict]:
    """--resume with --gpus: (done keys, {case: GPU}). ``gpus``: {CUDA_VISIBLE_DEVICES
    entry: GPU name} of this run. A case stays with the GPU of this host that measured it
    first; a swept config is done when any GPU of this run timed it (a GPU that helped with
    a shape timed its peers and default beside it: spak.tune.slots), a peer or the default
    when the case's own GPU did. A case measured on GPUs not in this run runs again whole."""
    done, claims = set(), {}
    for r, gpu in _rows_of_run(rows, gpus, kernel, retry_failed, family, host):
        owner = claims.setdefault(r["case"], gpu)
        if owner == gpu or not _is_anchor(r):
            done.add((r["case"], r["provider"], r["config_id"]))
    return done, claims


def anchors_by_gpu(rows, gpus: dict, kernel: str, retry_failed: bool,
                   family: str = families.DEFAULT, host: Optional[str] = None) -> set:
    """(case, provider, config_id, GPU) of the peer and default rows the file holds from
    GPUs of this run: a GPU that helps with such a case on --resume does not time them
    again."""
    return {(r["case"], r["provider"], r["config_id"], gpu)
            for r, gpu in _rows_of_run(rows, gpus, kernel, retry_failed, family, host)
            if _is_anchor(r)}


def _is_anchor(r: dict) -> bool:
    return r.get("config") is None or r.get("config_id") == "default"


def _rows_of_run(rows, gpus: dict, kernel, retry_failed, family, host):
    """(row, its GPU entry) of the resumable rows measured on this host by a GPU of this
    run (same entry, same name)."""
    host = host or socket.gethostname()
    for r in _resumable(rows, kernel, retry_failed, family):
        gpu = None if r.get("gpu_index") is None else str(r["gpu_index"])
        if r.get("host") == host and gpu in gpus and gpus[gpu] == r.get("gpu"):
            yield r, gpu


def gpu_list(text: str) -> list[str]:
    """--gpus: "all" (CUDA_VISIBLE_DEVICES' entries when set, else nvidia-smi's indices) or
    "0,1,3" -> the CUDA_VISIBLE_DEVICES entry of each GPU; ValueError saying what is wrong."""
    if text.strip().lower() == "all":
        env = os.environ.get("CUDA_VISIBLE_DEVICES")
        if env is not None:
            items = [x.strip() for x in env.split(",") if x.strip()]
        else:
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=60, check=True)
            except (OSError, subprocess.SubprocessError) as e:
                raise ValueError(f"cannot list this machine's GPUs (nvidia-smi: "
                                 f"{type(e).__name__}); name them, e.g. --gpus 0,1") from None
            items = [x.strip() for x in out.stdout.splitlines() if x.strip()]
        if not items:
            raise ValueError("no GPU visible (CUDA_VISIBLE_DEVICES is empty)")
        return items
    items = [x.strip() for x in text.split(",")]
    if not all(items) or not all(x.isdigit() or x.startswith(("GPU-", "MIG-")) for x in items):
        raise ValueError(f"{text!r} is not 'all' or a comma-separated list of GPU indices "
                         f"(or UUIDs), e.g. 0,1,3")
    if len(set(items)) != len(items):
        raise ValueError(f"{text!r} names a GPU twice")
    return items


def auto_out_path(gpu: str, kernel: str, family: str = families.DEFAULT) -> Path:
    """results/sweep-<gpu>-[<family>-]<kernel>-<date>.jsonl (the family named when it is
    not the default)."""
    fam = "" if family == families.DEFAULT else f"{family}-"
    return ROOT / "results" / f"sweep-{(slug(gpu) or 'gpu')}-{fam}{kernel}-{_utc('%Y-%m-%d')}.jsonl"


#: At most this many GPU compile helpers by default. A 4-GPU host's sweep needs its
#: variants (~1-3 s of tileiras each for the forward on sm_90) built as fast as 4 GPUs time
#: them, and the compile is the part more GPUs do not shorten: 8 helpers (the old cap) build
#: a 200-variant space in ~50 s, as long as 4 GPUs take to time it. CPU helpers (the
#: default, spak.tune.cpu_compile) hold no CUDA context and are not capped: CPUs - GPUs.
MAX_AUTO_COMPILE_JOBS = 32


def visible_gpu_count(gpus: Optional[str] = None) -> int:
    """How many GPUs a sweep times, without CUDA: the --gpus list's length; for "all" (or
    none given) the CUDA_VISIBLE_DEVICES list, else the driver's /proc entries; 1 when
    nothing says."""
    if gpus and gpus != "all":
        return max(1, len([g for g in gpus.split(",") if g.strip()]))
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None and env.strip():
        return len([g for g in env.split(",") if g.strip()])
    try:
        return max(1, len(os.listdir("/proc/driver/nvidia/gpus")))
    except OSError:
        return 1


def auto_compile_jobs(runner: str, *, gpus: int = 1, compile_on: str = "cpu") -> int:
    """Compile helpers by default, with a GPU runner and cuTile's disk cache (without it
    the helpers' cubins would be lost; else 0): CPUs - GPUs for CPU helpers (each measuring
    worker keeps a core), min(32, CPUs - 4) for GPU helpers (each holds a CUDA context on
    a timed GPU: 32 of them made every start-up on a 4x H200 host 13-15 s)."""
    if runner != "gpu":
        return 0
    try:
        from cuda.tile._cext import default_tile_context
        if default_tile_context.config.cache_dir is None:
            return 0                     # no disk cache: helpers' cubins would be lost
        from cuda.tile._compile import _get_compiler_version_string
        if _get_compiler_version_string() is None:
            return 0                     # cuTile keeps no disk cache without it either
    except Exception:  # noqa: BLE001
        pass
    cpus = os.cpu_count() or 2
    if compile_on == "cpu":
        return max(0, cpus - max(1, gpus))
    return max(0, min(MAX_AUTO_COMPILE_JOBS, cpus - 4))


# ------------------------------------------------------------------ the results file

def run_env(hello: dict, arch: str, commit: Optional[str], dirty) -> dict:
    """The fields every line of this run carries: GPU, arch, commit and versions."""
    return {"gpu": hello["gpu"], "host": socket.gethostname(), "arch": arch,
            "commit": commit, "dirty": dirty,
            "torch": hello.get("torch"), "cuda": hello.get("cuda"),
            "cuda_tile": hello.get("cuda_tile"), "spak": __version__}


def start_line(sweep, env: dict, fam, kernel: str, plan: SweepPlan, problems, todo: int,
               options: dict, command: str, worker_pid) -> dict:
    """The "start" line framing one invocation."""
    return {"schema": SCHEMA, "kind": "start", "sweep_id": sweep.sweep_id, "date": _utc(),
            **env, "family": fam.name, "kernel": kernel, "space": plan.space,
            "space_source": plan.source, "shapes": [p.case_id for p in problems],
            "jobs": len(plan.jobs), "todo": todo, "options": options, "command": command,
            "parent_pid": os.getpid(), "worker_pid": worker_pid, **sweep.frame_fields()}


def end_line(sweep, gpu: str, status: str, res: dict) -> dict:
    """The "end" line: how the invocation ended and what it did."""
    return {"schema": SCHEMA, "kind": "end", "sweep_id": sweep.sweep_id, "date": _utc(),
            "gpu": gpu, "status": status, "left": res["left"], "counts": res["counts"],
            "worker_starts": sweep.worker_starts, "wall_s": time.monotonic() - sweep.t0,
            "breakdown": sweep.breakdown(), **sweep.frame_fields()}


def result_rows(path, gpus, kernel: str, cases, family: str = families.DEFAULT) -> list:
    """The file's result rows of these GPU names (one name or several), family and shapes:
    this kernel's and the peers', several GPUs' rows of one measurement merged
    (spak.tune.merge)."""
    cases = set(cases)
    gpus = {gpus} if isinstance(gpus, str) else set(gpus)
    return merge_gpu_rows(
        r for r in read_results(path)
        if r.get("kind") == "result" and r.get("gpu") in gpus
        and r.get("family", families.DEFAULT) == family
        and (r.get("kernel") == kernel or str(r["provider"]).startswith("sdpa-"))
        and r.get("case") in cases)


# ------------------------------------------------------------------ printing

def list_lines(plan: SweepPlan, n_problems: int, est: dict, helpers: int) -> list[str]:
    """`spak sweep --list`: every job, the space and the estimate."""
    lines = [f"{j.case:<30} {j.provider:<20} {j.config_id}" for j in plan.jobs]
    lines.append(f"{len(plan.configs)} configs from {plan.source}: {json.dumps(plan.space)}")
    lines.append(f"{n_problems} shapes, {est['jobs']} jobs, {est['compile_units']} compile "
                 f"units; estimate ~{format_seconds(est['total_s'])} on an H100/H200 "
                 f"({format_seconds(est['run_s'])} timing, ~{format_seconds(est['compile_s'])} "
                 f"compiling with {helpers} helpers, start-up)")
    return lines


def header_text(env: dict, kernel: str, plan: SweepPlan, n_problems: int, resumed: int,
                out_path, est: dict, compile_jobs: int, budget_s, log_path,
                where: str = "") -> str:
    """What `spak sweep` prints before the first job (``where``: the GPUs, by default
    env's one)."""
    return (f"spak sweep on {where or env['gpu']} ({env['arch']}), kernel {kernel}: "
            f"{len(plan.configs)} configs from {plan.source}\n  space {json.dumps(plan.space)}"
            f"\n  {n_problems} shapes, {len(plan.jobs)} jobs"
            + (f", {resumed} already in {out_path} (resumed)" if resumed else "")
            + f"; {est['compile_units']} compile units, {compile_jobs} compile helpers; "
              f"estimate ~{format_seconds(est['total_s'])}"
            + (f" (budget {format_seconds(budget_s)})" if budget_s else "")
            + f"\n  results -> {out_path} (worker log {log_path}); commit "
              f"{env['commit'] or 'unknown (pass --commit)'}")


def summarize(rows: list[dict]) -> list[str]:
    """Lines of the end-of-sweep table: per shape the best config (marked *), the default
    tiles, SDPA cuDNN and flash, and the ratios."""
    by_case: dict = {}
    for r in rows:
        if r.get("kind") == "result":
            by_case.setdefault(r["case"], []).append(r)
    lines = [f"{'shape':<30} {'best config':<16} {'TFLOPS':>7} {'default':>7} {'cuDNN':>7} "
             f"{'flash':>7} {'best/def':>8} {'best/cuDNN':>10}  failed"]
    for case, rs in by_case.items():
        lines.append(_summary_line(case, rs))
    return lines


def _summary_line(case: str, rs: list[dict]) -> str:
    ok = [r for r in rs if r.get("status") == "ok" and r.get("tflops")]
    best = max((r for r in ok if str(r["provider"]).startswith("spak-")),
               key=lambda r: r["tflops"], default=None)
    dflt = max((r for r in ok if str(r["provider"]).endswith("-default")),
               key=lambda r: r["tflops"], default=None)
    cud = next((r for r in ok if r["provider"] == "sdpa-cudnn"), None)
    fla = next((r for r in ok if r["provider"] == "sdpa-flash"), None)
    nfail = sum(1 for r in rs if r.get("status") != "ok")

    def tf(r):
        return f"{r['tflops']:7.1f}" if r else f"{'-':>7}"

    def ratio(a, b):
        return a["tflops"] / b["tflops"] if a and b else float("nan")
    bid = (best["config_id"] if not best["provider"].endswith("-default") else "default") \
        if best else "-"
    return (f"{case:<30} {('* ' + bid):<16} {tf(best)} {tf(dflt)} {tf(cud)} {tf(fla)} "
            f"{ratio(best, dflt):8.3f} {ratio(best, cud):10.3f}  {nfail}")
