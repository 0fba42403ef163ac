"""`spak store`: the tuned-config store: update it from sweep results, show it, look a
problem up (the work: spak.tune.choose and spak.tune.store)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spak.cli.args import add_family_argument
from spak.tune import choose
from spak.tune import store as tuned

__all__ = ["register", "cmd_store"]


def _update(args) -> int:
    missing = [f for f in args.results if not Path(f).exists()]
    if missing:
        print(f"spak store: no such results file: {', '.join(missing)}", file=sys.stderr)
        return 2
    for line in choose.update_store(args.results, args.store, tiles_only=args.tiles_only,
                                    gpu=args.gpu, kernel=args.kernel, dry_run=args.dry_run,
                                    family=args.family, min_gain=args.min_gain):
        print(line)
    return 0


def _lookup(args) -> int:
    if tuned.key_fields(args.family) != tuned.V1_FIELDS:
        print(f"spak store: lookup takes dtype, head dim, causal and Sk; {args.family} files "
              f"its configs under {', '.join(tuned.key_fields(args.family) or ())}",
              file=sys.stderr)
        return 2
    causal = args.causal.lower() in ("yes", "true", "1", "causal")
    r = tuned.lookup(args.gpu_name, args.kernel_name, args.dtype, args.head_dim, causal,
                     args.seq_len, path=args.store, strict=True, family=args.family)
    print("none (spak.fmha uses gpu.plan.default_tiles)" if r is None else
          choose.config_text(r) + f"  {r}")
    return 0


def cmd_store(args) -> int:
    try:
        if args.action == "update":
            return _update(args)
        if args.action == "show":
            print(choose.format_store(tuned.load_store(args.store), args.family))
            return 0
        if args.action == "lookup":
            return _lookup(args)
    except tuned.TunedStoreError as e:
        print(f"spak store: {e}", file=sys.stderr)
        return 1
    return 2


def register(subparsers) -> None:
    """Add `spak store`."""
    p = subparsers.add_parser(
        "store", help="the tuned-config store: update it from sweep results, show, look up",
        description=choose.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=None,
                   help="store path (default: $SPAK_TUNED_CONFIGS or "
                        "spak/data/tuned_configs.json)")
    add_family_argument(p)
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    u = sub.add_parser("update", help="merge the best configs of sweep results into the store")
    u.add_argument("results", nargs="+", help="sweep results files (JSONL)")
    u.add_argument("--tiles-only", action="store_true",
                   help="only configs without occupancy/num_ctas hints compete")
    u.add_argument("--gpu", default=None, help="only this GPU's rows")
    u.add_argument("--kernel", default=None, help="only this kernel's rows")
    u.add_argument("--min-gain", type=float, default=0.0, metavar="F",
                   help="another config must beat the default tiles by this fraction (e.g. "
                        "0.03) to be filed; else the default is (default 0: any margin)")
    u.add_argument("--dry-run", action="store_true", help="print, do not write")
    sub.add_parser("show", help="print the store as a table")
    lk = sub.add_parser("lookup", help="what spak.fmha would get for a problem")
    lk.add_argument("gpu_name")
    lk.add_argument("kernel_name")
    lk.add_argument("dtype")
    lk.add_argument("head_dim", type=int)
    lk.add_argument("causal", help="yes/no")
    lk.add_argument("seq_len", type=int, help="key sequence length Sk")
    p.set_defaults(func=cmd_store)
