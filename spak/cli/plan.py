"""`spak plan [PLAN]`: carry out a plan file as the dual loop and write its report (the
work: spak.recipe.runner.PlanRunner; the report: spak.recipe.render)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spak import families

__all__ = ["register", "cmd_plan", "DESCRIPTION"]

DESCRIPTION = """\
CPU loop (any machine, no GPU): for every step in order, its CPU gates

    prototype   spak.cpu.softmax_proto.check_prototype: online vs global softmax (float64)
    kernel      the step's kernel on its shapes in the CPU simulator, through its kernel
                family (as `spak sim`), for each numeric model: error vs float64 per dtype,
                NaN/Inf count, the simulator's checker clean; then the compile gate: every
                variant compiles for every arch (tileiras, CPU)
    sweep       every tile pair of every target's sweep space runs correctly on the
                simulator (sim_shapes), so the GPU sweep has only speed left to find

It stops at the first failed gate and says why. Then, when PyTorch sees a CUDA GPU whose
arch is a plan target, the GPU loop: `spak run` for each kernel step (error vs float64,
agreement with the simulator, throughput against the arch's floors), and the sweeper for
the sweep step. Either part may be missing (not installed here): the report then says
"not available" for those gates, which is not a failure.

With --gpu-results FILE..., the GPU gates are judged on result lines recorded earlier by
`spak run` / `spak sweep` on a GPU machine instead (the report names the files and says the
GPU loop was not run by this invocation).

Each step belongs to a kernel family (its `family` key; default fmha_fwd); --family runs
only that family's steps.

Exit status: 0 every gate that ran passed (the CPU gates always run), 1 a gate failed,
2 bad usage or a malformed plan (rejected before anything runs)."""


def _summary_line(doc: dict) -> str:
    from spak.recipe.gates import FAIL, NOT_JUDGED, PASS
    gates = doc["gates"]
    return (f"{'PASS' if doc['status'] == PASS else 'FAIL'}: "
            f"{sum(g['status'] == PASS for g in gates)} gates passed, "
            f"{sum(g['status'] == FAIL for g in gates)} failed, "
            f"{sum(g['status'] in NOT_JUDGED for g in gates)} not run; "
            f"{doc['wall_seconds']:.1f} s")


def cmd_plan(args: argparse.Namespace) -> int:
    from spak.recipe import render
    from spak.recipe.gates import PASS
    from spak.recipe.machine import read_result_files
    from spak.recipe.runner import PlanRunner
    from spak.recipe.schema import PlanError, load_plan
    try:
        plan = load_plan(args.plan).only_family(args.family)
    except PlanError as e:
        print(f"spak plan: {e}", file=sys.stderr)
        print("spak plan: the plan was rejected before anything ran", file=sys.stderr)
        return 2
    if not plan.steps:
        print(f"spak plan: the plan has no step of family {args.family}", file=sys.stderr)
        return 2
    out_dir = Path(args.out) if args.out else render.default_out_dir()

    def log(msg):
        print(msg, flush=True)

    log(f"spak plan {plan.path}: {plan.title}")
    targets = ", ".join(f"{a} ({', '.join(t.gpus)})" for a, t in plan.targets.items())
    log(f"  targets: {targets}; {len(plan.steps)} steps: "
        f"{', '.join(s.id for s in plan.steps)}")
    for w in plan.warnings:
        log(f"  warning: {w}")
    recorded = None
    if args.gpu_results:
        try:
            recorded = read_result_files(args.gpu_results)
        except OSError as e:
            print(f"spak plan: error: --gpu-results: {e}", file=sys.stderr)
            return 2
    runner = PlanRunner(plan, out_dir=out_dir, log=log, compile=not args.no_compile,
                        gpu=not args.no_gpu, jobs=args.jobs, seed=args.seed,
                        verbose=args.verbose, recorded=recorded,
                        recorded_files=args.gpu_results)
    doc = runner.run()
    md, js = render.write_report(doc, out_dir)
    log("")
    log(_summary_line(doc))
    for line in doc["not_checked"]:
        log(f"  not checked: {line}")
    log(f"report: {md} and {js}")
    return 0 if doc["status"] == PASS else 1


def register(subparsers) -> None:
    """Add `spak plan`."""
    p = subparsers.add_parser(
        "plan", help="carry out a plan: CPU gates of every step, then the GPU loop if a GPU "
                     "is present; writes a report",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("plan", nargs="?", default=None, metavar="PLAN",
                   help="plan file (default: plans/fmha.toml)")
    p.add_argument("--family", choices=families.names(), default=None,
                   help="only this kernel family's steps (default: every family the plan names)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="report directory (default: results/plan-<host>-<date>)")
    p.add_argument("--no-compile", action="store_true",
                   help="skip the tileiras compile gates (reported as skipped)")
    p.add_argument("--no-gpu", action="store_true",
                   help="do not run the GPU loop even if a GPU is present")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="compile in N processes (default 1)")
    p.add_argument("--seed", type=int, default=None,
                   help="input seed for every step (default: each step's own)")
    p.add_argument("--verbose", action="store_true", help="a progress line per simulated case")
    p.add_argument("--gpu-results", nargs="+", default=None, metavar="JSONL",
                   help="judge the GPU gates on these `spak run` / `spak sweep` result files "
                        "(recorded on a GPU machine) instead of running the GPU loop here")
    p.set_defaults(func=cmd_plan)
