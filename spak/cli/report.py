"""`spak report`: tables, plots and the leaderboard from sweep (and run) results (the work:
spak.report.load, tables, plots, leaderboard, regress)."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from pathlib import Path

from spak import families

__all__ = ["register", "cmd_report", "main", "DESCRIPTION"]

ROOT = Path(__file__).resolve().parents[2]
DESCRIPTION = """\
    spak report results/sweep-*.jsonl                  # report.md + PNGs in results/report-.../
    spak report results/sweep-*.jsonl --update-leaderboard
    spak report --check results/sweep-new.jsonl --tolerance 0.05   # regression gate

Inputs: JSON-lines results of `spak sweep` (schema spak.sweep/1 or /2) and
of `spak run` (spak.run/1, spak.run/2); lines of other kinds are skipped. When a (shape,
provider, config) was measured more than once, the last line read counts (files in the
order given).
Each row belongs to a kernel family (its "family" field; absent: fmha_fwd), which says
how its shapes are grouped, its metric (TFLOPS or GB/s) and its peers; rows of several
families are reported family by family (--family keeps one).

Outputs, in --out-dir (default results/report-<gpu>-<date>/):

* report.md: per (GPU, kernel, dtype) the providers per shape (SPAK tuned = the best of
  SPAK's configs, the default tiles included; SPAK default tiles; SDPA cuDNN; SDPA flash)
  with ratios and geometric means; per (head dim, causal) a configs x shapes table of
  TFLOPS with the best per shape in bold and starred and failures abbreviated; the
  failures with their errors; the leaderboard.
* tflops-<gpu>-<kernel>-<dtype>.png: TFLOPS vs sequence length, grouped bars per provider,
  one panel per head dim x causal (the FlashAttention papers' figure layout).
* heatmap-<gpu>-<kernel>-<dtype>-d<D>-<causal>.png: per (head dim, causal), one TILE_M x
  TILE_N heatmap per shape (cell: the best TFLOPS over occupancy/num_ctas and kernel
  knobs, annotated with the ones that reached it; best cell framed).

The leaderboard (--leaderboard, default results/leaderboard.json) keeps the best SPAK
figure per (GPU, kernel, dtype, shape) with the config, the git commit that set it, the
date and the results file. --update-leaderboard merges the given results into it;
--check compares the given results with it and exits 1 when any shape's best SPAK figure
is more than --tolerance (a fraction) below the leaderboard's.

Plots need matplotlib (pip install -e ".[report]"); --no-plots writes the markdown only."""
INSTALL_HINT = ('spak report: plots need matplotlib, which is not installed.\n'
                '  install it with:  pip install -e ".[report]"   (or: pip install matplotlib)\n'
                '  or pass --no-plots for the markdown tables only')


def _select(rows, args) -> list:
    if args.family:
        rows = [r for r in rows if r.family == args.family]
    if args.gpu:
        rows = [r for r in rows if r.gpu == args.gpu]
    if args.kernel:
        rows = [r for r in rows if r.kernel == args.kernel or not r.is_spak]
    return rows


def _check(rows, lb, lb_path: Path, tolerance: float) -> int:
    from spak.report.regress import check_regressions
    if not lb_path.exists():
        print(f"spak report --check: no leaderboard at {lb_path}; create it with "
              f"`spak report RESULTS --update-leaderboard`", file=sys.stderr)
        return 2
    ok, lines = check_regressions(rows, lb, tolerance)
    print(f"spak report --check: {len(lines)} shape(s) against {lb_path}, tolerance "
          f"{tolerance:g}")
    print("\n".join(lines))
    print("PASS: no shape more than {:.1%} below the leaderboard".format(tolerance)
          if ok else "FAIL: regression(s) beyond the tolerance")
    return 0 if ok else 1


def _out_dir(rows, given) -> Path:
    """--out-dir, else results/report-<gpu or "multi">-<latest date>."""
    from spak.results.provenance import slug
    if given:
        return Path(given)
    gpus = sorted({str(r.gpu) for r in rows})
    date = max((r.date[:10] for r in rows), default="") or _dt.date.today().isoformat()
    return ROOT / "results" / (f"report-{(slug(gpus[0]) or 'x') if len(gpus) == 1 else 'multi'}"
                               f"-{date}")


def cmd_report(args: argparse.Namespace) -> int:
    from spak.report import leaderboard as board
    from spak.report.load import load_rows, sections
    from spak.report.tables import markdown
    from spak.results.jsonl import repo_path
    missing = [f for f in args.results if not Path(f).exists()]
    if missing:
        print(f"spak report: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    rows = _select(load_rows(args.results), args)
    if not rows:
        print("spak report: no result rows in the given files", file=sys.stderr)
        return 1
    lb_path = Path(args.leaderboard)
    try:
        lb = board.load_leaderboard(lb_path)
    except (ValueError, json.JSONDecodeError) as e:
        print(f"spak report: {e}", file=sys.stderr)
        return 2
    if args.check:
        return _check(rows, lb, lb_path, args.tolerance)
    if not args.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(INSTALL_HINT, file=sys.stderr)
            return 1
    out_dir = _out_dir(rows, args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.update_leaderboard:
        for line in board.update_leaderboard(lb, rows):
            print("  leaderboard: " + line)
        board.write_leaderboard(lb, lb_path)
    plots: dict = {}
    if not args.no_plots:
        from spak.report.plots import write_plots
        plots = write_plots(sections(rows), out_dir)
    md = markdown(rows, sources=[repo_path(f) for f in args.results], plots=plots,
                  leaderboard=lb if (lb["entries"] or args.update_leaderboard) else None)
    (out_dir / "report.md").write_text(md + "\n")
    print(f"spak report: {out_dir / 'report.md'}" + (f" and {len(plots)} PNG(s)" if plots
                                                     else ""))
    return 0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", help="results files (JSONL) of spak sweep / spak run")
    p.add_argument("--out-dir", default=None,
                   help="where report.md and the PNGs go (default results/report-<gpu>-<date>)")
    p.add_argument("--no-plots", action="store_true", help="markdown only (no matplotlib)")
    p.add_argument("--family", choices=families.names(), default=None,
                   help="only rows of this kernel family (default: every family given)")
    p.add_argument("--gpu", default=None, help="only rows of this GPU name")
    p.add_argument("--kernel", default=None, help="only this kernel (SDPA rows kept)")
    p.add_argument("--leaderboard", default=str(ROOT / "results" / "leaderboard.json"),
                   help="leaderboard JSON (default results/leaderboard.json)")
    p.add_argument("--update-leaderboard", action="store_true",
                   help="merge these results' best figures into the leaderboard")
    p.add_argument("--check", action="store_true",
                   help="regression gate: exit 1 if a shape's best SPAK figure is more than "
                        "--tolerance below the leaderboard (writes nothing)")
    p.add_argument("--tolerance", type=float, default=0.05,
                   help="allowed fraction below the leaderboard for --check (default 0.05)")


def register(subparsers) -> None:
    """Add `spak report`."""
    p = subparsers.add_parser(
        "report", help="markdown tables, plots and the leaderboard from sweep/run results",
        description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_report)


def main(argv=None) -> int:
    """`python -m spak.cli.report ...`: the same as `spak report ...`."""
    p = argparse.ArgumentParser(prog="python -m spak.cli.report", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    return cmd_report(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
