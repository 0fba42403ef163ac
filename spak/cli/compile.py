"""`spak compile`: the plan's kernel variants compiled to cubins for each target arch, on
the CPU (the work: spak.device.compile_report; each variant through its kernel family)."""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from spak import families
from spak.device import compile_report as _work   # called through the module: tests patch it

__all__ = ["register", "cmd_compile"]


def _arch_list(text: str) -> list[str]:
    archs = [a.strip() for a in text.split(",") if a.strip()]
    for a in archs:
        if not re.fullmatch(r"sm_\d+[a-z]?", a):
            raise argparse.ArgumentTypeError(f"{a!r} is not an arch such as sm_90")
    if not archs:
        raise argparse.ArgumentTypeError("no arch given")
    return archs


def cmd_compile(args: argparse.Namespace) -> int:
    from spak.recipe.schema import PlanError, load_plan
    try:
        plan = load_plan(args.plan)
    except PlanError as e:
        print(f"spak compile: {e}", file=sys.stderr)
        return 2
    archs = args.arch or plan.archs
    kernels = [args.kernel] if args.kernel else None
    items = _work.plan_items(plan, archs, kernels, args.family)
    if args.sweep:
        items += _work.sweep_items(plan, archs, kernels, args.family)
    if not items:
        print("spak compile: the plan names no kernel variant to compile"
              + (f" for kernel {args.kernel}" if args.kernel else ""), file=sys.stderr)
        return 2
    if args.list:
        for it in items:
            print(f"{it.label:<38} {it['arch']}")
        return 0
    supported, how = _work.supported_archs()
    log = sys.stderr if args.json else sys.stdout
    print(f"spak compile: {len(items)} variant(s) of plan {plan.name!r} for "
          f"{', '.join(archs)}; tileiras: {how}"
          + (f" (accepts {', '.join(supported)})" if supported else ""), file=log, flush=True)
    for a in archs:
        if supported is not None and a not in supported:
            print(f"  {a}: arch not supported by this tileiras; its variants are failures",
                  file=log, flush=True)
    print(_work.HEADER, file=log, flush=True)
    t0 = time.perf_counter()
    rows = _work.compile_items(items, jobs=args.jobs, supported=supported,
                         progress=lambda r, i, n: print(_work.format_row(r), file=log, flush=True))
    wall = time.perf_counter() - t0
    s = _work.summarize(rows)
    for line in _work.hint_findings(rows):
        print(line, file=log, flush=True)
    print(_work.summary_line(s, wall), file=log, flush=True)
    doc = {"command": "compile", "plan": str(plan.path), "archs": archs,
           "tileiras": how, "tileiras_archs": supported, "rows": rows,
           "summary": {**s, "wall_seconds": wall}}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    if args.json:
        print(json.dumps(doc, indent=1))
    ok = s["failed"] == 0 and s["unsupported"] == 0
    if args.same_code_as:
        ok = _same_code(args.same_code_as, rows, log) and ok
    return 0 if ok else 1


def _same_code(path: str, rows, log) -> bool:
    with open(path) as f:
        before = json.load(f)["rows"]
    changed = _work.code_changes(before, rows)
    n = sum(len(r.get("kernels") or []) for r in rows)
    if changed:
        print(f"machine code differs from {path}:", file=log)
        for line in changed:
            print(line, file=log)
    else:
        print(f"machine code of all {n} kernel(s) identical to {path}", file=log)
    return not changed


DESCRIPTION = _work.__doc__.split("\n\n", 1)[1].split("Exit status")[0].rstrip() + """

Exit status: 0 every variant compiled, 1 a variant failed or an arch is unsupported,
2 bad usage or a malformed plan."""


def register(subparsers) -> None:
    """Add `spak compile`."""
    p = subparsers.add_parser(
        "compile", help="compile the plan's kernel variants to cubins for each arch (no GPU)",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", type=_arch_list, default=None, metavar="SM[,SM...]",
                   help="comma-separated archs, e.g. sm_90,sm_120,sm_89 (default: the plan's "
                        "targets)")
    p.add_argument("--plan", default=None, metavar="PLAN",
                   help="plan file (default: plans/fmha.toml)")
    p.add_argument("--family", choices=families.names(), default=None,
                   help="only this kernel family's steps (default: every family the plan names)")
    p.add_argument("--kernel", default=None, help="only this kernel (default: all the plan's)")
    p.add_argument("--sweep", action="store_true",
                   help="also compile every config of each arch's sweep space (tiles x "
                        "occupancy x num_ctas; fp16, D 64 and 128, causal and not) and say "
                        "which hints tileiras did not meet and which configs are the same "
                        "kernel")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="compile in N processes (default 1)")
    p.add_argument("--out", default=None, metavar="FILE", help="also write the JSON here")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document (the table goes to stderr)")
    p.add_argument("--same-code-as", default=None, metavar="FILE",
                   help="compare each kernel's machine code (sha1 of its code sections) with "
                        "an earlier --out FILE; exit 1 if any differs: a refactor that keeps "
                        "every cubin's code needs no GPU re-check")
    p.add_argument("--list", action="store_true", help="list the variants and exit")
    p.set_defaults(func=cmd_compile)
