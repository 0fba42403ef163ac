"""`spak sweep`: tile configs of a kernel family checked and timed on the local GPU (the
work: spak.tune.sweep and the scheduler in spak.tune.runner); this module parses the
arguments, runs the steps and prints."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from spak.cli.args import add_family_argument, family_of, shapes_epilog
from spak.core.errors import ShapeError
from spak.results.jsonl import ResultsWriter, read_results
from spak.results.provenance import git_commit
from spak.tune import sweep as S
from spak.tune.jobs import estimate_seconds
from spak.tune.runner import Sweep, SweepOptions, format_seconds
from spak.tune.space import ROOT, parse_space_args
from spak.tune.merge import disagreement_lines
from spak.tune.timeline import breakdown_lines

__all__ = ["register", "cmd_sweep", "add_arguments"]


def _err(msg: str, code: int = 2) -> int:
    print(f"spak sweep: {msg}", file=sys.stderr)
    return code


@dataclass
class _Request:
    """What the arguments resolve to before anything runs."""
    fam: object
    kernel: str
    problems: list
    override: dict
    timing: dict
    compile_jobs: int


def _resolve(args) -> "_Request | int":
    """The request, or an exit status after printing why the arguments are unusable."""
    fam = family_of(args)
    kernel = args.kernel or fam.kernels[0]
    if kernel not in fam.kernels:
        return _err(f"error: argument --kernel: {fam.name} has kernels "
                    f"{', '.join(fam.kernels)}, not {kernel!r}")
    try:
        problems, skipped = S.select_problems(fam, args.shapes or list(fam.sweep_shapes),
                                              dtype=args.dtype,
                                              causal=args.causal)
    except ShapeError as e:
        return _err(f"error: argument --shapes: {e}")
    for why in dict.fromkeys(w for _, w in skipped):
        cases = [p.case_id for p, w in skipped if w == why]
        print(f"spak sweep: skipping {len(cases)} shape(s), {why}: {', '.join(cases[:3])}"
              + (" ..." if len(cases) > 3 else ""), file=sys.stderr)
    if not problems:
        return _err("error: no shape selected that the sweep can time")
    try:
        override = parse_space_args(args.space, fam)
    except ValueError as e:
        return _err(f"error: argument --space: {e}")
    timing = {"warmup": args.warmup, "batches": args.batches, "batch_ms": args.batch_ms,
              "max_sets": args.max_sets}
    compile_jobs = S.auto_compile_jobs(
        args.runner, gpus=S.visible_gpu_count(args.gpus) if args.gpus else 1,
        compile_on=args.compile_on) if args.compile_jobs == "auto" else int(args.compile_jobs)
    return _Request(fam, kernel, problems, override, timing, compile_jobs)


def _plan(args, req: _Request, arch: str):
    return S.plan_sweep(req.fam, req.kernel, req.problems, arch, plan_path=args.plan,
                        override=req.override, default=not args.no_default,
                        peers=() if args.no_sdpa else None)


def _list(args, req: _Request) -> int:
    try:
        plan = _plan(args, req, args.arch or "sm_90")
    except ValueError as e:
        return _err(f"error: {e}")
    helpers = req.compile_jobs or 8
    est = estimate_seconds(plan.jobs, compile_jobs=helpers, timing=req.timing)
    print("\n".join(S.list_lines(plan, len(req.problems), est, helpers)))
    return 0


def _preload_plan_checks() -> None:
    """Import what reading the plan file needs (its field checks import the simulator's
    numeric models, hence numba: ~2-3 s) in a thread while the workers start (seconds of
    torch and CUDA set-up in their own processes), instead of after: the sweep's set-up
    is its start-up plus this, once per sweep and per GPU count."""
    def load():
        try:
            from spak.recipe.fields import known_models
            known_models()
        except Exception:  # noqa: BLE001 -- the plan step reports its own errors
            pass
    threading.Thread(target=load, daemon=True).start()


def _start(args, req: _Request, commit):
    """A Sweep with its worker(s) started and the first hello, or an exit status."""
    if args.gpus and args.ray:
        return _err("error: --gpus and --ray exclude each other (a Ray cluster places "
                    "its tasks on its GPUs itself)")
    try:
        gpus = S.gpu_list(args.gpus) if args.gpus else None
    except ValueError as e:
        return _err(f"error: argument --gpus: {e}")
    opts = SweepOptions(kernel=req.kernel, timeout=args.timeout, budget_s=args.budget_s,
                        compile_jobs=req.compile_jobs, runner=args.runner,
                        compile_on=args.compile_on,
                        timing=req.timing, retry_failed=args.retry_failed, commit=commit,
                        retry_faults=gpus is not None)
    # The worker reports the GPU name, which the automatic --out name needs; until then the
    # log has a fixed name for automatic outputs.
    auto = args.out == "auto"
    where = dict(log_path=(ROOT / "results" / "sweep-worker.log" if auto
                           else Path(args.out).with_suffix(".log")))
    out = ROOT / "results" / "sweep.jsonl" if auto else Path(args.out)
    if args.ray:
        from spak.tune.cluster import RaySweep   # Ray is imported for --ray only
        sweep = RaySweep(out, opts, address=args.ray, **where)
    else:
        sweep = Sweep(out, opts, gpus=gpus, **where)
        sweep.compiler.warm()                # helpers start beside the workers
    _preload_plan_checks()
    try:
        hellos = sweep.start_workers() if gpus else [sweep.start_worker()]
    except RuntimeError as e:
        sweep.shutdown()
        return _err(f"cannot start: {e}", 1)
    archs = sorted({h["arch"] for h in hellos})
    if len(archs) > 1 and not args.arch:
        sweep.shutdown()
        return _err(f"error: --gpus mixes {' and '.join(archs)}, which have their own sweep "
                    f"spaces: sweep each arch's GPUs on their own (or pass --arch)")
    if auto:
        sweep.out_path = S.auto_out_path(hellos[0]["gpu"], req.kernel, req.fam.name)
    return sweep, hellos[0]


def _done(args, req: _Request, sweep, existing) -> tuple[set, dict, set]:
    """What --resume skips, and (with --gpus) which GPU each measured shape stays on and
    which peers and default configs each GPU has timed already."""
    if not args.resume:
        return set(), {}, set()
    if args.ray:                             # any of the cluster's GPUs
        return S.done_keys(existing, None, req.kernel, args.retry_failed,
                           req.fam.name), {}, set()
    if sweep.multi:
        gpus = {s.gpu: s.hello["gpu"] for s in sweep.slots if s.hello and not s.retired}
        a = (existing, gpus, req.kernel, args.retry_failed, req.fam.name)
        return (*S.done_by_gpu(*a), S.anchors_by_gpu(*a))
    return S.done_keys(existing, sweep.slots[0].hello["gpu"], req.kernel, args.retry_failed,
                       req.fam.name), {}, set()


def _record_run(sweep, plan, writer, env, done, claims, have) -> tuple[dict, bool]:
    """Run the jobs; (the result, whether ^C stopped it)."""
    try:
        kw = {"have_anchors": have} if have else {}      # RaySweep.run takes no anchors
        return sweep.run(plan.jobs, writer, env, done=done, claims=claims, **kw), False
    except KeyboardInterrupt:
        sweep.shutdown()
        return {"finished": None, "left": None, "counts": sweep.counts,
                "stopped": "interrupted"}, True


def _update_store(args, req: _Request, out_path, gpu: str) -> int:
    from spak.tune import choose
    try:
        changes = choose.update_store([out_path], path=args.store,
                                      tiles_only=args.store_tiles_only, gpu=gpu,
                                      kernel=req.kernel, family=req.fam.name)
    except Exception as e:  # noqa: BLE001 -- reported, the results are safe on disk
        return _err(f"could not update the store: {type(e).__name__}: {e}", 1)
    for line in changes:
        print("  store: " + line)
    return 0


def _exit_status(args, res: dict, interrupted: bool) -> int:
    if interrupted:
        return 130
    if res["stopped"] == "budget":
        print(f"spak sweep: stopped before --budget-s {args.budget_s:g}: {res['left']} jobs "
              f"left; run the same command with --resume to finish")
        return 3
    if res["stopped"]:
        return _err(f"stopped: {res['stopped']}", 1)
    return 0


def _report(args, req: _Request, sweep, res: dict, status: str) -> int:
    """The summary table and the closing line; the store update when asked (1 if it
    failed, else 0)."""
    names = sweep.gpu_names()
    rows = S.result_rows(sweep.out_path, names, req.kernel,
                         [p.case_id for p in req.problems], req.fam.name)
    print("\n".join(S.summarize(rows)))
    odd = disagreement_lines(rows)
    if odd:
        print(f"GPUs of one model that disagree beyond the run-to-run spread ({len(odd)}):\n  "
              + "\n  ".join(odd))
    counts = ", ".join(f"{v} {k}" for k, v in sorted(res["counts"].items()))
    print("\n".join(breakdown_lines(sweep.breakdown())))
    print(f"spak sweep: {status}; this run: {counts or 'nothing to do'}; "
          f"{format_seconds(time.monotonic() - sweep.t0)} wall; results in {sweep.out_path}")
    if args.update_store:
        return _update_store(args, req, sweep.out_path,
                             names[0] if len(set(names)) == 1 else None)
    return 0


def _sweep(args, req: _Request) -> int:
    commit, dirty = git_commit(args.commit)
    started = _start(args, req, commit)
    if isinstance(started, int):
        return started
    sweep, hello = started
    out_path, arch = sweep.out_path, args.arch or hello["arch"]
    try:
        plan = _plan(args, req, arch)
    except ValueError as e:
        sweep.shutdown()
        return _err(f"error: {e}")
    existing = read_results(out_path, warn=lambda m: print("warning: " + m, file=sys.stderr))
    if existing and not args.resume:
        sweep.shutdown()
        return _err(f"{out_path} already holds {len(existing)} lines: pass --resume to "
                    f"continue it (skipping what it has), or choose another --out")
    done, claims, have = _done(args, req, sweep, existing)
    todo = [j for j in plan.jobs if j.key not in done]
    env = S.run_env(hello, arch, commit, dirty)
    est = estimate_seconds(todo, compile_jobs=req.compile_jobs, timing=req.timing,
                           workers=sweep.gpu_count())
    print(S.header_text(env, req.kernel, plan, len(req.problems),
                        len(plan.jobs) - len(todo) if done else 0, out_path, est,
                        req.compile_jobs, args.budget_s, sweep.log_path,
                        sweep.where()), flush=True)
    writer = ResultsWriter(out_path)
    writer.write(S.start_line(
        sweep, env, req.fam, req.kernel, plan, req.problems, len(todo),
        {"timeout": args.timeout, "budget_s": args.budget_s,
         "compile_jobs": req.compile_jobs, **req.timing},
        "spak " + shlex.join(args.argv or sys.argv[1:]), hello.get("pid")))
    res, interrupted = _record_run(sweep, plan, writer, env, done, claims, have)
    status = "complete" if not res["stopped"] else res["stopped"]
    writer.write(S.end_line(sweep, env["gpu"], status, res))
    writer.close()
    if _report(args, req, sweep, res, status):
        return 1
    return _exit_status(args, res, interrupted)


def cmd_sweep(args: argparse.Namespace) -> int:
    req = _resolve(args)
    if isinstance(req, int):
        return req
    return _list(args, req) if args.list else _sweep(args, req)


DESCRIPTION = S.__doc__.split("\n\n", 1)[1]


def register(subparsers) -> None:
    """Add `spak sweep`."""
    p = subparsers.add_parser(
        "sweep", help="sweep tile configs on the local GPU: check, time, find the best",
        description=DESCRIPTION, epilog=shapes_epilog()
        + "\n\nresult lines (JSON):\n  " + S.RESULT_FIELDS.replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_sweep, argv=None)


def add_arguments(p) -> None:
    from spak import families
    kernels = list(dict.fromkeys(k for n in families.names() for k in families.get(n).kernels))
    add_family_argument(p)
    p.add_argument("--kernel", choices=kernels, default=None)
    p.add_argument("--shapes", nargs="+", default=None,
                   metavar="SHAPE", help="named sets and/or shapes (default: the family's "
                   "sweep set: standard for fmha_fwd/fmha_bwd, bench for fmha_decode)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="fp16")
    p.add_argument("--causal", choices=("yes", "no", "both"), default="both")
    p.add_argument("--plan", default=None,
                   help="plan file whose [sweep.<arch>] is the search space "
                        "(default: plans/fmha.toml)")
    p.add_argument("--space", nargs="+", default=None, metavar="KEY=V,V",
                   help="override space lists: TILE_M=64,128 TILE_N=64,128 occupancy=1,2,auto "
                        "num_ctas=1 (auto: left to cuTile); kernel knobs too, e.g. "
                        "LAT_K=0,4 LAT_V=0,4 (0: the compiler's choice)")
    p.add_argument("--arch", default=None,
                   help="use this arch's space (default: the GPU's; sm_90 for --list)")
    p.add_argument("--out", default="auto", metavar="PATH",
                   help="results JSONL, appended (default: results/sweep-<gpu>-<kernel>-"
                        "<date>.jsonl); the worker log goes beside it (.log)")
    p.add_argument("--resume", action="store_true",
                   help="continue --out: skip the (shape, provider, config) it already has")
    p.add_argument("--retry-failed", action="store_true",
                   help="with --resume: run again what failed (timeouts, crashes, ...)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds one config may take (compile + check + timing) before its "
                        "worker is killed (default 120)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget: start no job that would not finish in it; "
                        "exit 3 (resumable) if jobs are left")
    p.add_argument("--compile-jobs", default="auto",
                   help="compile helper processes ahead of the worker (default auto: "
                        "CPUs - GPUs with --compile-on cpu, min(32, CPUs-4) with gpu; "
                        "0: the worker compiles)")
    p.add_argument("--compile-on", choices=("cpu", "gpu"), default="cpu",
                   help="where the compile helpers build cubins: cpu (default; no torch, "
                        "no CUDA context: the launch's signature derived from the shapes; "
                        "a unit they cannot model goes to a GPU helper) or gpu (each "
                        "helper launches the variant on tiny tensors)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls (default 3)")
    p.add_argument("--batches", type=int, default=5,
                   help="timed batches; the median batch is reported (default 5)")
    p.add_argument("--batch-ms", type=float, default=40.0,
                   help="target length of one batch of back-to-back calls (default 40)")
    p.add_argument("--max-sets", type=int, default=4,
                   help="input sets rotated so L2 does not flatter small shapes (default 4)")
    p.add_argument("--no-sdpa", action="store_true", help="do not time SDPA cuDNN/flash")
    p.add_argument("--no-default", action="store_true", help="do not time the default tiles")
    p.add_argument("--update-store", action="store_true",
                   help="write the best config per bucket into the tuned-config store")
    p.add_argument("--store", default=None,
                   help="tuned-config store path (default spak/data/tuned_configs.json)")
    p.add_argument("--store-tiles-only", action="store_true",
                   help="store only configs without occupancy/num_ctas hints (for a spak.fmha "
                        "that applies TILE_M/TILE_N only)")
    p.add_argument("--commit", default=None,
                   help="git commit to record (default: git rev-parse HEAD, or $SPAK_COMMIT)")
    p.add_argument("--list", action="store_true",
                   help="print the jobs and a time estimate, run nothing (no GPU needed)")
    p.add_argument("--gpus", default=None, metavar="all|0,1,3",
                   help="one worker per GPU (pinned with CUDA_VISIBLE_DEVICES) fed from one "
                        "queue; each shape is timed whole (peers too) on one GPU; a worker "
                        "that faults is restarted and its job retried once (default: one "
                        "worker on the GPUs this process sees)")
    p.add_argument("--ray", nargs="?", const="auto", default=None, metavar="ADDRESS",
                   help="run the jobs as Ray tasks (one GPU each) on a Ray cluster: auto "
                        "(default: this machine's cluster or $RAY_ADDRESS), local (start "
                        "one here), or ray://HEAD:PORT; needs the cluster extra "
                        "(pip install -e \".[cluster]\")")
    p.add_argument("--runner", default=os.environ.get("SPAK_SWEEP_RUNNER", "gpu"),
                   help=argparse.SUPPRESS)   # "fake:SPEC" for the CPU tests
