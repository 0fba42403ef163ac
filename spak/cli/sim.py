"""`spak sim`: run a kernel family's kernels on the CPU simulator and check every output
against its float64 reference under the family's gates.

The rows come from `KernelFamily.sim_case`; this module only selects the cases, prints
the table (or one JSON document) and sets the exit status.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Callable, Sequence

from spak import __version__, families
from spak.cli.args import (add_family_argument, family_of, model_arg, parse_tiles,
                           shapes_epilog)
from spak.core.errors import ShapeError
from spak.core.metrics import GATES
from spak.results.jsonl import jsonable as _jsonable

__all__ = ["register", "cmd_sim", "format_table", "format_row", "summary_line", "TABLE_HEADER"]


# ----------------------------------------------------------------- the table

TABLE_COLUMNS = (  # (title, width, key, format)
    ("kernel", 6, "kernel", "{}"),
    ("shape", 24, "shape", "{}"),
    ("causal", 6, "causal", "{}"),
    ("dtype", 5, "dtype", "{}"),
    ("rel L2", 9, "rel_l2", "{:.2e}"),
    ("max abs", 9, "max_abs", "{:.2e}"),
    ("NaN/Inf", 7, "nonfinite", "{}"),
    ("sim s", 7, "seconds", "{:.2f}"),
    ("result", 6, "passed", "{}"),
)
TABLE_HEADER = "  ".join(f"{t:<{w}}" for t, w, _, _ in TABLE_COLUMNS)


def _cell(key: str, fmt: str, value) -> str:
    if key == "causal":
        return "yes" if value else "no"
    if key == "passed":
        return "PASS" if value else "FAIL"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-" if value is None else "nan"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def format_row(r: dict) -> str:
    """One result as a table line; an error goes on the next line, indented."""
    line = "  ".join(f"{_cell(k, f, r.get(k)):<{w}}" for _, w, k, f in TABLE_COLUMNS).rstrip()
    if r.get("error"):
        line += "\n    error: " + str(r["error"]).strip().replace("\n", "\n    ")
    return line


def format_table(rows: Sequence[dict]) -> str:
    return "\n".join([TABLE_HEADER.rstrip(), *(format_row(r) for r in rows)])


def summary_line(rows: Sequence[dict], wall: float | None = None) -> str:
    """"12/13 cases passed (fused 6/7, naive 6/6), 1 FAILED; ...": the run in one line."""
    n, ok = len(rows), sum(bool(r.get("passed")) for r in rows)
    per = ", ".join(f"{k} {sum(bool(r.get('passed')) for r in rows if r.get('kernel') == k)}/"
                    f"{sum(r.get('kernel') == k for r in rows)}"
                    for k in dict.fromkeys(r.get("kernel") for r in rows))
    s = f"{ok}/{n} cases passed ({per})" + ("" if ok == n else f", {n - ok} FAILED")
    s += "; gates: rel L2 <= " + ", ".join(f"{v:g} {k}" for k, v in GATES.items())
    s += ", no NaN/Inf"
    sim_s = sum(float(r.get("seconds") or 0.0) for r in rows)
    s += f"; {sim_s:.1f} s simulated"
    return s + (f", {wall:.1f} s in all" if wall is not None else "")




# ---------------------------------------------------------------------- sim

def _load_run_case(family) -> Callable[..., dict]:
    """The executor `spak sim` drives: the family's `sim_case(kernel, problem, tiles=,
    model=, seed=)`; tests replace this."""
    return family.sim_case


def _sim_models():
    """The simulator's numeric model names, or None when it cannot be imported."""
    try:
        from spak.sim.numerics import MODELS
    except ImportError:
        return None
    return set(MODELS)


def _run_one(run_case, family, kernel, spec, args) -> dict:
    """Run one case; an exception becomes a FAIL row, never the end of the run."""
    base = {"kernel": kernel, "shape": spec.display, "case": spec.case_id, "causal": spec.causal,
            "dtype": spec.dtype, "rel_l2": None, "max_abs": None, "nonfinite": None,
            "seconds": None, "gate": family.gate(spec, family.outputs[0]), "passed": False,
            "error": None}
    try:
        r = dict(run_case(kernel, spec, tiles=args.tiles, model=args.model, seed=args.seed))
    except Exception as e:  # noqa: BLE001 -- reported in the table, run goes on
        base["error"] = f"{type(e).__name__}: {e}"
        return base
    r.update(kernel=kernel, shape=spec.display, case=spec.case_id,
             causal=spec.causal, dtype=spec.dtype)
    r["passed"] = bool(r.get("passed")) and not r.get("error")
    return {**base, **r}


def cmd_sim(args: argparse.Namespace) -> int:
    family = family_of(args)
    kernels = family.kernels if args.kernel == "all" else (args.kernel,)
    if args.kernel not in ("all", *family.kernels):
        print(f"spak sim: error: argument --kernel: family {family.name} has no kernel "
              f"{args.kernel!r}; choose from {', '.join(family.kernels)} or all", file=sys.stderr)
        return 2
    try:
        specs = family.select(args.shapes, dtype=args.dtype, causal=args.causal)
    except ShapeError as e:  # validated at parse time; kept for direct callers
        print(f"spak sim: error: argument --shapes: {e}", file=sys.stderr)
        return 2
    if not specs:
        print("spak sim: error: argument --shapes: no case matches --shapes "
              f"{' '.join(args.shapes)} with --dtype {args.dtype} --causal {args.causal}",
              file=sys.stderr)
        return 2
    if args.list:
        for s in specs:
            print(s.case_id)
        return 0
    # before the simulator is imported: its import and first cases compile numba kernels
    from spak.cpu import firstrun
    cold = firstrun.announce()
    try:
        run_case = _load_run_case(family)
    except ImportError as e:
        print(f"spak sim: the simulator runner cannot be loaded: {type(e).__name__}: {e}\n"
              f"  (is SPAK installed with its dependencies? pip install -e \".[test]\")",
              file=sys.stderr)
        return 1
    models = _sim_models()
    if models is not None and args.model not in models:
        print(f"spak sim: error: argument --model: unknown numeric model {args.model!r}; "
              f"choose one of {', '.join(sorted(models))}", file=sys.stderr)
        return 2
    out = sys.stdout
    if not args.json:
        fam = "" if family.name == "fmha_fwd" else f"family {family.name}, "
        print(f"spak sim: {fam}{len(kernels) * len(specs)} cases, model {args.model}, "
              f"tiles {'default' if args.tiles is None else '%dx%d' % args.tiles}, "
              f"seed {args.seed}", file=out)
        print(TABLE_HEADER.rstrip(), file=out, flush=True)
    t0 = time.perf_counter()
    rows = []
    for kernel in kernels:
        for spec in specs:
            rows.append(_run_one(run_case, family, kernel, spec, args))
            # progress: the table on stdout, or on stderr so --json's stdout stays one document
            print(format_row(rows[-1]), file=sys.stderr if args.json else out, flush=True)
    wall = time.perf_counter() - t0
    ok = all(r["passed"] for r in rows)
    if cold and any(r["passed"] for r in rows):    # a case ran through: the cache is filled
        firstrun.mark_warm()
    if args.json:
        doc = {"spak": __version__, "command": "sim", "model": args.model, "seed": args.seed,
               **({} if family.name == "fmha_fwd" else {"family": family.name}),
               "tiles": list(args.tiles) if args.tiles else None, "results": rows,
               "summary": {"cases": len(rows), "passed": sum(r["passed"] for r in rows),
                           "failed": sum(not r["passed"] for r in rows),
                           "wall_seconds": wall, "all_passed": ok}}
        print(json.dumps(_jsonable(doc), indent=1, allow_nan=False), file=out)
    else:
        print(summary_line(rows, wall), file=out)
    return 0 if ok else 1


SIM_DESCRIPTION = """\
Run a kernel family's tile kernels on the CPU simulator and check them against
the float64 reference. With no arguments: the FMHA forward's fused and naive
kernels on the small default set of shapes ({n} cases each), fp16 and bf16,
causal and not. --family picks another family (its grammar: --family F --help).

Gates: relative L2 error <= {fp16:g} (fp16) or <= {bf16:g} (bf16), and no NaN/Inf.
Exit status: 0 all cases pass, 1 a case fails a gate or errors, 2 bad usage.
"""


def register(subparsers) -> None:
    """Add `spak sim`."""
    p = subparsers.add_parser(
        "sim", help="run the kernels on the CPU simulator and check them (no GPU needed)",
        description=SIM_DESCRIPTION.format(n=len(family_of(None).shape_sets["default"]),
                                           **GATES),
        epilog=shapes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_family_argument(p)
    kernels = sorted({k for name in families.names() for k in families.get(name).kernels})
    p.add_argument("--kernel", choices=(*kernels, "all"), default="all",
                   help="which kernel of the family to run (default: all of them)")
    p.add_argument("--shapes", nargs="+", default=["default"], metavar="SHAPE",
                   help="named sets and/or shape strings, space or comma separated "
                        "(grammar below; default: the 'default' set)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="all",
                   help="input dtype; filters a set's fixed dtypes, expands open ones (default: all)")
    p.add_argument("--causal", choices=("yes", "no", "both"), default="both",
                   help="causal masking; filters or expands like --dtype (default: both)")
    p.add_argument("--tiles", type=parse_tiles, default=None, metavar="MxN",
                   help="TILE_M x TILE_N, powers of two, e.g. 64x64 (default: the kernel's own)")
    p.add_argument("--model", type=model_arg, default="sm_90",
                   help="the simulator's numeric model of the target GPU (default: sm_90)")
    p.add_argument("--seed", type=int, default=0, help="input seed (default: 0)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON document instead of the table")
    p.add_argument("--list", action="store_true",
                   help="print the selected cases and exit without running them")
    p.set_defaults(func=cmd_sim)


