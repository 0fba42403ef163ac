"""`spak calibrate`: the simulator's numeric model against a GPU's probe results, op by op
(the work: spak.device.calibrate)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spak.device import calibrate as _work

__all__ = ["register", "cmd_calibrate"]


def cmd_calibrate(args: argparse.Namespace) -> int:
    if args.quick and not getattr(args, "record", None):
        print("spak calibrate: --quick goes with --record DIR", file=sys.stderr)
        return 2
    if getattr(args, "record", None):
        return _work.record(Path(args.record), quick=args.quick)
    if args.tables:
        return _work.record_tables(args.tables)
    if not args.check:
        print("spak calibrate: give --check, --record DIR or --tables OUT", file=sys.stderr)
        return 2
    data = Path(args.data) if args.data else _work.probe_now()
    if data is None:
        print("spak calibrate: the probes did not run (a CUDA GPU and cuTile are needed; "
              "or pass --data DIR with recorded probe files)", file=sys.stderr)
        return 1
    if not data.is_dir():
        print(f"spak calibrate: --data {data}: no such directory", file=sys.stderr)
        return 2
    lines, bad = _work.check(_work.model_for(data, args.model, bool(args.data)), data)
    if not lines:
        print(f"spak calibrate: no probe files in {data}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 1 if bad else 0


def register(subparsers) -> None:
    """Add `spak calibrate`."""
    p = subparsers.add_parser(
        "calibrate", help="compare the simulator's numeric model with a GPU's probe results",
        description=_work.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="print per-op bit-identity of the model against the probes")
    p.add_argument("--data", default=None, metavar="DIR",
                   help="recorded probe files (default: record them now on the local GPU)")
    p.add_argument("--model", default=None,
                   help="numeric model name (default: the arch in DIR/calibration.json, "
                        "else sm_90)")
    p.add_argument("--tables", default=None, metavar="OUT",
                   help="record the exhaustive MUFU tables on the local GPU into OUT")
    p.add_argument("--record", default=None, metavar="DIR",
                   help="on a local GPU: run the probes, the MUFU tables and the FMHA "
                        "agreement cases into DIR (then --check --data DIR anywhere)")
    p.add_argument("--quick", action="store_true",
                   help="with --record: fewer cases, meant for under 2 minutes (the full "
                        "record did not finish in 150 s on an H200); every exact op and both "
                        "FMHA kernels still checked (no per-op kernels)")
    p.set_defaults(func=cmd_calibrate)
