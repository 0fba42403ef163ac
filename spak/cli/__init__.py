"""The `spak` command line.

Each subcommand lives in a module with a `register(subparsers)` function that
adds its parser and sets `func` (called with the parsed args, returns the exit
code). `COMMAND_MODULES` lists those modules; a new command is one new module
plus one line here. Command modules must import cheaply: torch, cuTile and the
simulator are imported inside the command's function, so `spak --help` works
on any machine. A module that fails to import still gets a command, which
explains the failure instead of breaking every other command.

Exit codes: 0 success, 1 a gate or check failed, 2 bad usage (argparse's own).
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import sys
import time
from typing import Callable, Sequence

from spak import __version__
from spak.core.metrics import GATES
from spak.attention.problems import GRAMMAR_HELP, SHAPE_SETS, ShapeError, parse_case, select_cases
from spak.results.jsonl import jsonable as _jsonable

__all__ = ["main", "build_parser", "COMMAND_MODULES", "parse_tiles", "shape_arg",
           "format_table", "format_row", "summary_line", "TABLE_HEADER"]

#: Modules holding a `register(subparsers)`; "spak.cli" registers `sim`, "spak.device.gpurun" `run`.
COMMAND_MODULES: list[str] = ["spak.cli", "spak.device.gpurun", "spak.recipe.runner", "spak.device.compile_report",
                               "spak.tune.sweep", "spak.tune.choose", "spak.report.build", "spak.device.calibrate"]

KERNELS = ("fused", "naive")


# ------------------------------------------------------------ argument types

#: gpu.plan's tile bounds (MIN_TILE, MAX_TILE), repeated so the CLI imports cheaply.
TILE_RANGE = (16, 256)


def parse_tiles(text: str) -> tuple[int, int]:
    """"64x128" -> (64, 128): TILE_M x TILE_N, each a power of two in [16, 256]."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not TILE_MxTILE_N, e.g. 64x64")
    tm, tn = int(m.group(1)), int(m.group(2))
    lo, hi = TILE_RANGE
    for name, t in (("TILE_M", tm), ("TILE_N", tn)):
        if t < 1 or t & (t - 1):
            raise argparse.ArgumentTypeError(f"{name} must be a power of two, got {t}")
        if not lo <= t <= hi:
            raise argparse.ArgumentTypeError(f"{name} must be in [{lo}, {hi}], got {t}")
    return tm, tn


def shape_arg(text: str) -> str:
    """Validate one --shapes item (comma lists allowed) at parse time; keep the text."""
    for item in filter(None, (s.strip() for s in text.split(","))):
        if item.lower() in SHAPE_SETS:
            continue
        try:
            parse_case(item)
        except ShapeError as e:
            if "x" not in item.lower():
                raise argparse.ArgumentTypeError(
                    f"{item!r} is neither a shape set ({', '.join(SHAPE_SETS)}) "
                    f"nor a shape such as 1x8x128x64") from None
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def model_arg(text: str) -> str:
    if not re.fullmatch(r"sm_\d+", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a numeric model name such as sm_90")
    return text


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

def _load_run_case() -> Callable[..., dict]:
    """The executor `spak sim` drives (spak/simrun.py); tests replace this."""
    from spak.cpu.simrun import run_case
    return run_case


def _sim_models():
    """The simulator's numeric model names, or None when it cannot be imported."""
    try:
        from spak.sim.numerics import MODELS
    except ImportError:
        return None
    return set(MODELS)


def _run_one(run_case, kernel, spec, args) -> dict:
    """Run one case; an exception becomes a FAIL row, never the end of the run."""
    base = {"kernel": kernel, "shape": spec.display, "case": spec.case_id, "causal": spec.causal,
            "dtype": spec.dtype, "rel_l2": None, "max_abs": None, "nonfinite": None,
            "seconds": None, "gate": GATES[spec.dtype], "passed": False, "error": None}
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
    kernels = KERNELS if args.kernel == "all" else (args.kernel,)
    try:
        specs = select_cases(args.shapes, dtype=args.dtype, causal=args.causal)
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
    try:
        run_case = _load_run_case()
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
        print(f"spak sim: {len(kernels) * len(specs)} cases, model {args.model}, "
              f"tiles {'default' if args.tiles is None else '%dx%d' % args.tiles}, "
              f"seed {args.seed}", file=out)
        print(TABLE_HEADER.rstrip(), file=out, flush=True)
    t0 = time.perf_counter()
    rows = []
    for kernel in kernels:
        for spec in specs:
            rows.append(_run_one(run_case, kernel, spec, args))
            # progress: the table on stdout, or on stderr so --json's stdout stays one document
            print(format_row(rows[-1]), file=sys.stderr if args.json else out, flush=True)
    wall = time.perf_counter() - t0
    ok = all(r["passed"] for r in rows)
    if args.json:
        doc = {"spak": __version__, "command": "sim", "model": args.model, "seed": args.seed,
               "tiles": list(args.tiles) if args.tiles else None, "results": rows,
               "summary": {"cases": len(rows), "passed": sum(r["passed"] for r in rows),
                           "failed": sum(not r["passed"] for r in rows),
                           "wall_seconds": wall, "all_passed": ok}}
        print(json.dumps(_jsonable(doc), indent=1, allow_nan=False), file=out)
    else:
        print(summary_line(rows, wall), file=out)
    return 0 if ok else 1


SIM_DESCRIPTION = """\
Run the FMHA tile kernels on the CPU simulator and check them against the
float64 reference. With no arguments: both kernels on the small default set
of shapes ({n} cases each), fp16 and bf16, causal and not.

Gates: relative L2 error <= {fp16:g} (fp16) or <= {bf16:g} (bf16), and no NaN/Inf.
Exit status: 0 all cases pass, 1 a case fails a gate or errors, 2 bad usage.
"""


def _describe_sets() -> str:
    """E.g. "default (13), seed (4, dtype and causal open)" for --help."""
    parts = []
    for name, items in SHAPE_SETS.items():
        fixed = [parse_case(t)[1] for t in items]
        open_ = [a for a in ("dtype", "causal") if not all(a in f for f in fixed)]
        parts.append(f"{name} ({len(items)}" + (f", {' and '.join(open_)} open)" if open_ else ")"))
    return ", ".join(parts)


def register(subparsers) -> None:
    """Add `spak sim`."""
    p = subparsers.add_parser(
        "sim", help="run the kernels on the CPU simulator and check them (no GPU needed)",
        description=SIM_DESCRIPTION.format(n=len(SHAPE_SETS["default"]), **GATES),
        epilog=GRAMMAR_HELP.format(sets=_describe_sets()),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernel", choices=(*KERNELS, "all"), default="all",
                   help="which kernel to run (default: all)")
    p.add_argument("--shapes", nargs="+", type=shape_arg, default=["default"], metavar="SHAPE",
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


# --------------------------------------------------------------------- main

def _unavailable(name: str, err: BaseException) -> Callable[[argparse.Namespace], int]:
    def func(args):
        print(f"spak {name}: unavailable: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return func


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spak",
        description="SPAK: simulate-then-run framework for GPU tile kernels (FMHA first). "
                    "Start with `spak sim`.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"spak {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in COMMAND_MODULES:
        try:
            importlib.import_module(mod_name).register(sub)
        except Exception as e:  # noqa: BLE001 -- one broken command must not hide the others
            short = mod_name.rsplit(".", 1)[-1]
            p = sub.add_parser(short, help=f"(unavailable: {type(e).__name__})")
            p.set_defaults(func=_unavailable(short, e))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help(sys.stderr)
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
