"""The `spak` command line.

One thin module per command in this package (sim, run, plan, compile, sweep, store,
report, calibrate), each with a `register(subparsers)` that adds its parser and sets
`func` (called with the parsed args, returns the exit code). `COMMAND_MODULES` lists them;
a new command is one new module plus one line here. Command modules import cheaply: torch,
cuTile and the simulator are imported inside the command's function, so `spak --help`
works on any machine. A module that fails to import still gets a command, which explains
the failure instead of breaking every other command. Commands that take --family check
--shapes against that family's grammar after parsing (`spak.cli.args.check_shapes`).

Exit codes: 0 success, 1 a gate or check failed, 2 bad usage (argparse's own).
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Callable, Sequence

from spak import __version__
from spak.cli.args import check_shapes

__all__ = ["main", "build_parser", "COMMAND_MODULES"]

#: Modules holding a `register(subparsers)`, in the order `spak --help` lists the commands.
COMMAND_MODULES: list[str] = ["spak.cli.sim", "spak.cli.run", "spak.cli.plan",
                              "spak.cli.compile", "spak.cli.sweep", "spak.cli.store",
                              "spak.cli.report", "spak.cli.calibrate"]


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
    check_shapes(args)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
