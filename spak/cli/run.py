"""`spak run`: check, simulate-compare and time a kernel family's kernels on the local GPU.

The loop is spak.device.gpurun (per shape: spak.device.case); this module parses the
arguments, prints the table (or one JSON document) and sets the exit status.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from spak import __version__, families
from spak.cli.args import add_family_argument, family_of, model_arg, parse_tiles, shapes_epilog
from spak.core.errors import ShapeError
from spak.core.metrics import GATES
from spak.results.jsonl import append_jsonl, jsonable

__all__ = ["register", "cmd_run", "DESCRIPTION"]

#: --sim-work's default: simulated rows x keys x head dim x heads per shape (~1 s);
#: spak.device.agreement.DEFAULT_SIM_WORK, repeated so `spak --help` stays cheap
DEFAULT_SIM_WORK = 1 << 29


def _csv(text: str) -> list:
    return [t for t in text.split(",") if t]


def _check_choices(args, fam):
    """A usage error for an unknown --timing mode or --peers name, or None."""
    from spak.device import peers, timing
    bad = [m for m in args.timing if m not in timing.MODES]
    if bad:
        return f"argument --timing: unknown mode(s) {bad}; choose from {', '.join(timing.MODES)}"
    bad = [n for n in (args.peers or ()) if n not in peers.names()]
    if bad:
        return f"argument --peers: unknown peer(s) {bad}; choose from {', '.join(peers.names())}"
    return None


def _select(args, fam):
    """(problems, kernels), or an exit status after printing the usage error."""
    if args.kernel is not None and args.kernel not in ("all", *fam.kernels):
        print(f"spak run: error: argument --kernel: family {fam.name} has no kernel "
              f"{args.kernel!r}; choose from {', '.join(fam.kernels)} or all", file=sys.stderr)
        return 2
    try:
        # no --shapes: the family's own default sets (fmha_decode has no "standard")
        specs = fam.select(args.shapes or list(fam.run_shapes), dtype=args.dtype,
                           causal=args.causal)
    except ShapeError as e:
        print(f"spak run: error: argument --shapes: {e}", file=sys.stderr)
        return 2
    if not specs:
        print("spak run: error: argument --shapes: no case matches", file=sys.stderr)
        return 2
    bad = _check_choices(args, fam)
    if bad:
        print(f"spak run: error: {bad}", file=sys.stderr)
        return 2
    kernel = args.kernel or fam.kernels[0]
    return specs, (fam.kernels if kernel == "all" else (kernel,))


def _environment(args, fam):
    """The run's RunEnv, or an exit status after saying why the GPU loop cannot run."""
    from spak.device import env as gpu_env
    from spak.device import gpurun
    missing = gpurun.gpu_missing()
    if missing:
        print(f"spak run: {missing}", file=sys.stderr)
        return 1
    if not fam.has_gpu_loop():
        print(f"spak run: family {fam.name} has no GPU loop (KernelFamily.gpu_inputs, "
              f"gpu_reference, gpu_call, sim_slice)", file=sys.stderr)
        return 1
    env = gpurun.RunEnv(args.argv if args.argv is not None else sys.argv[1:])
    problems = gpu_env.diagnose(arch=env.arch)
    if problems:
        print(gpu_env.format_problems(problems), file=sys.stderr)
        if any(p.code in ("tileiras-missing", "arch-unsupported") for p in problems):
            return 1
    return env


def cmd_run(args: argparse.Namespace) -> int:
    from spak.device import table
    fam = family_of(args)
    picked = _select(args, fam)
    if isinstance(picked, int):
        return picked
    specs, kernels = picked
    if args.list:
        for s in specs:
            print(s.case_id)
        return 0
    env = _environment(args, fam)
    if isinstance(env, int):
        return env
    from spak.device import gpurun
    out_path = gpurun.results_path(args.out, env)
    log = sys.stderr if args.json else sys.stdout
    all_rows = []

    def emit(row):
        append_jsonl(out_path, row)
        all_rows.append(row)

    ceiling = None
    if not args.no_time:
        row = gpurun.ceiling_row(env)
        ceiling = row["tflops"]
        emit(row)
    print(f"spak run on {env.gpu} ({env.arch}), torch {env.base['torch']}, cuTile "
          f"{env.base['cuda_tile']}, "
          + ("" if fam.name == families.DEFAULT else f"family {fam.name}, ")
          + f"{len(specs)} shapes x {len(kernels)} kernel(s)"
          + (f"; fp16 matmul ceiling {ceiling:.0f} TFLOPS" if ceiling else "")
          + (f"; rows -> {out_path}" if out_path else ""), file=log, flush=True)
    if not args.no_sim:
        print("simulator check on a slice per shape (batch 0, first query head(s), last query "
              "rows, all keys; see each row's sim.slice); bit% = simulator output bits equal "
              "to the GPU's", file=log)
    print(table.header(fam), file=log, flush=True)

    def show(rows):
        for line in table.format_case(rows, fam):
            print(line, file=log, flush=True)
    t0 = time.perf_counter()
    gpurun.run_problems(fam, specs, kernels, args, env, emit, ceiling, show)
    line = table.summary(all_rows, fam) + f"; {time.perf_counter() - t0:.0f} s"
    print(line, file=log, flush=True)
    if args.dump:
        print(gpurun.save_dump(args.dump, env.dump), file=log, flush=True)
    if args.plot:
        from spak.report.runplot import plot_run
        try:
            print(f"plot: {plot_run(all_rows, args.plot)}", file=log, flush=True)
        except ImportError as e:           # the rows are written; only the figure is lost
            print(f"plot: not drawn, needs matplotlib ({e}); pip install -e \".[report]\"",
                  file=log, flush=True)
    if args.json:
        print(json.dumps(jsonable({"spak": __version__, "command": "run", "env": env.base,
                                   "ceiling_tflops": ceiling, "rows": all_rows,
                                   "summary": line}), indent=1))
    return 0 if gpurun.run_passed(all_rows) else 1


DESCRIPTION = """\
Run SPAK's kernels on the local CUDA GPU: check them against float64 and PyTorch SDPA,
compare them bit for bit with the CPU simulator (on a slice), and time them next to
SDPA's flash, cuDNN and efficient backends and an fp16 matmul ceiling.

    spak run                                   # standard + seed shapes, fp16, fused
    spak run --kernel all --shapes gates --dtype all --no-time   # correctness sweep
    spak run --shapes 4x16x2048x128/causal --json
    spak run --family fmha_decode --shapes 1x32:8x32768x128 --timing kernel,eager --plot d.png

Gates: relative L2 vs float64 <= {fp16:g} (fp16), <= {bf16:g} (bf16), no NaN/Inf, fully
masked rows zero. Exit status: 0 all pass, 1 a case fails or errors, 2 bad usage.
"""


def register(subparsers) -> None:
    """Add `spak run`."""
    p = subparsers.add_parser(
        "run", help="check, simulate-compare and time the kernels on the local GPU",
        description=DESCRIPTION.format(**GATES), epilog=shapes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    kernels = sorted({k for name in families.names() for k in families.get(name).kernels})
    p.add_argument("--kernel", choices=(*kernels, "all"), default=None,
                   help="which kernel(s) (default: fused)")
    p.add_argument("--shapes", nargs="+", default=None, metavar="SHAPE",
                   help="named sets and/or shapes (default: the family's run sets: standard "
                        "seed; fmha_decode models-small)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="fp16",
                   help="input dtype (default: fp16)")
    p.add_argument("--causal", choices=("yes", "no", "both"), default="both")
    p.add_argument("--tiles", type=parse_tiles, default=None, metavar="MxN",
                   help="TILE_M x TILE_N (default: tuned store, else the arch default)")
    p.add_argument("--model", type=model_arg, default=None,
                   help="simulator numeric model (default: the GPU's arch, e.g. sm_90)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-sim", action="store_true", help="skip the simulator comparison")
    p.add_argument("--sim-heads", type=int, default=1,
                   help="query heads the simulator re-computes (default 1)")
    p.add_argument("--sim-work", type=int, default=DEFAULT_SIM_WORK,
                   help="simulated rows*keys*D*heads budget per shape; fewer query rows "
                        "are simulated when a shape is bigger (default 2^29)")
    p.add_argument("--dump", default=None, metavar="NPZ",
                   help="write the slices the simulator does not reproduce bit for bit "
                        "(inputs + GPU output, <= 15 MiB) to NPZ, for offline replay with "
                        "tools/agree_replay.py")
    p.add_argument("--no-time", action="store_true", help="correctness only, no timing")
    p.add_argument("--no-sdpa", action="store_true", help="do not time SDPA's backends")
    p.add_argument("--peers", type=_csv, default=None, metavar="A,B",
                   help="peer plug-ins to time (spak.device.peers: sdpa, sdpa-math, "
                        "nvidia-sample, tilegym, flashinfer, copy; default: every one "
                        "serving the family but sdpa-math; a missing one is a row note)")
    p.add_argument("--timing", type=_csv, default=["kernel"], metavar="MODE[,MODE]",
                   help="timing modes (spak.device.timing.MODES): kernel (GPU time, back to "
                        "back, L2 defeated by rotated inputs), flush (do_bench: each call "
                        "alone after an L2 flush), eager (N eager calls, one synchronize: "
                        "the cost a program pays per call, host included); the first is "
                        "the row's ms_median (default: kernel)")
    p.add_argument("--repeats", type=int, default=3,
                   help="turns over the providers (forward, backward, then shuffled); "
                        "each provider's best turn counts (default 3)")
    p.add_argument("--plot", default=None, metavar="PNG",
                   help="one plot of the run's rows (per shape: each provider's time, "
                        "one panel per timing mode; needs matplotlib)")
    p.add_argument("--max-sets", type=int, default=8,
                   help="most input sets rotated while timing (default 8)")
    p.add_argument("--naive-max-gb", type=float, default=16.0,
                   help="skip the naive kernel when its S+P workspace exceeds this (GiB)")
    p.add_argument("--out", default="auto", metavar="PATH",
                   help="results JSONL, appended line by line (default: "
                        "results/run-<gpu>-<date>.jsonl; '-' for none)")
    p.add_argument("--json", action="store_true", help="print one JSON document at the end "
                   "(the table goes to stderr)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    add_family_argument(p)
    p.set_defaults(func=cmd_run, argv=None)
