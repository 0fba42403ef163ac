"""The tuned-config store, written from sweep results: `spak store` and `spak sweep --update-store`.

The store is spak/data/tuned_configs.json (format and reader: spak.tune.store, whose ``lookup``
spak.fmha calls). One entry per

    (GPU name, kernel, dtype, head dim, causal, sequence-length bucket)

where the bucket is ``spak.tune.store.seq_bucket(Sk)``: the power of two at or above the key
length, at least 128 (Sk = 1000 and 1024 share bucket 1024; 4096 is its own). A lookup
takes the entry of the problem's bucket, else the nearest bucket in log2 for the same
(GPU, kernel, dtype, head dim, causal), the larger on a tie, else nothing (spak.fmha then
uses gpu.plan.default_tiles). The GPU name must match exactly
(``torch.cuda.get_device_name()``): an H100 entry never serves an H200.

Choosing an entry. From the results' "ok" rows of one (GPU, kernel, dtype, head dim,
causal, bucket) group, each config (the swept ones and the default tiles, which compete
too) is scored by the geometric mean of its TFLOPS over the group's shapes; only configs
measured on the most shapes compete (a config missing a shape cannot win it). The
winner's tiles, and its occupancy / num_ctas hints when set, go into the entry with its
TFLOPS, the default tiles' TFLOPS, the date and commit of the measurement and the results
file. Since the default tiles compete, the stored config is never slower than the default
in the run that chose it.

    spak store update results/sweep-*.jsonl      # merge a sweep's winners into the store
    spak store show                              # the store as a table
    spak store lookup "NVIDIA H100 80GB HBM3" fused fp16 128 yes 4096
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Iterable, Optional

from spak.tune import store as tuned
from spak.results.jsonl import repo_path
from spak.core.stats import geomean
from spak.results.jsonl import read_results, row_problem

__all__ = ["choose", "update_store", "format_store", "register", "cmd_store"]


def _usable(r: dict, row_problem) -> bool:
    """Whether a result row has what choose() needs, with the right types."""
    if row_problem(r) or r.get("tflops", 0) <= 0:
        return False
    if not all(isinstance(r.get(k), str) for k in ("gpu", "kernel", "case", "config_id")):
        return False
    if not all(isinstance(r.get(k), int) and r[k] >= 1 for k in ("D", "Sk")):
        return False
    if not all(isinstance(r["config"].get(k), int) for k in ("TILE_M", "TILE_N")):
        return False
    try:
        tuned.normalize_dtype(r.get("dtype"))
    except ValueError:
        return False
    return True


def choose(rows: Iterable[dict], *, tiles_only: bool = False, gpu: Optional[str] = None,
           kernel: Optional[str] = None) -> list[dict]:
    """Store entries (spak.tune.store format) chosen from result rows (see the module doc).

    ``tiles_only``: only configs without occupancy/num_ctas hints compete (for a spak.fmha
    that applies the tiles dict alone). Rows carry "_source" (their file) when read by
    update_store.
    """
    groups: dict = {}
    for r in rows:
        if r.get("kind") != "result" or r.get("status") != "ok" or not r.get("tflops"):
            continue
        prov = str(r.get("provider", ""))
        if not prov.startswith("spak-") or not r.get("config"):
            continue
        if not _usable(r, row_problem):
            continue                 # a malformed row of a corrupt file: not a candidate
        if gpu is not None and r.get("gpu") != gpu or kernel is not None and \
                r.get("kernel") != kernel:
            continue
        cfg = r["config"]
        hinted = cfg.get("occupancy") is not None or cfg.get("num_ctas") is not None
        if tiles_only and hinted:
            continue
        key = (r["gpu"], r["kernel"], tuned.normalize_dtype(r["dtype"]), int(r["D"]),
               bool(r["causal"]), tuned.seq_bucket(int(r["Sk"])))
        cid = "default" if prov.endswith("-default") else r["config_id"]
        # later rows (a newer sweep appended to a file, a later file) replace earlier ones
        groups.setdefault(key, {}).setdefault(cid, {})[r["case"]] = r
    entries = []
    for key, by_cfg in groups.items():
        most = max(len(m) for m in by_cfg.values())
        scored = []
        for cid, m in by_cfg.items():
            if len(m) == most:
                scored.append((geomean(r["tflops"] for r in m.values()), cid, m))
        scored.sort(key=lambda t: (-t[0], t[1] != "default", t[1]))
        score, cid, m = scored[0]
        dflt = by_cfg.get("default")
        any_row = max(m.values(), key=lambda r: r.get("date") or "")
        cfg = any_row["config"]
        tiles = {"TILE_M": int(cfg["TILE_M"]), "TILE_N": int(cfg["TILE_N"])}
        for h, v in cfg.items():            # hints and kernel knobs, when set
            if h not in tiles and v is not None:
                tiles[h] = int(v)
        gpu_name, kern, dtype, d, causal, bucket = key
        dflt_score = geomean(dflt[c]["tflops"] for c in m if c in dflt) \
            if dflt and all(c in dflt for c in m) else None
        entry = tuned.make_entry(
            gpu_name, kern, dtype, d, causal, bucket, tiles,
            config_id=cid if cid != "default" else f"default ({tiles['TILE_M']}x"
                                                   f"{tiles['TILE_N']})",
            tflops=round(score, 2),
            default_tflops=None if dflt_score is None else round(dflt_score, 2),
            speedup_vs_default=None if not dflt_score else round(score / dflt_score, 4),
            cases=sorted(m), date=(any_row.get("date") or "")[:10],
            commit=any_row.get("commit"), sweep_id=any_row.get("sweep_id"),
            source=any_row.get("_source"))
        entry["seq_bucket"] = bucket
        entries.append(entry)
    entries.sort(key=lambda e: (e["gpu"], e["kernel"], e["dtype"], e["head_dim"],
                                e["causal"], e["seq_bucket"]))
    return entries


def update_store(results: Iterable, path=None, *, tiles_only: bool = False,
                 gpu: Optional[str] = None, kernel: Optional[str] = None,
                 dry_run: bool = False) -> list[str]:
    """Merge the winners of the results files into the store (atomic write); returns one
    line per entry saying what changed."""
    rows = []
    for f in results:
        for r in read_results(f):
            r["_source"] = repo_path(f)
            rows.append(r)
    entries = choose(rows, tiles_only=tiles_only, gpu=gpu, kernel=kernel)
    store = tuned.load_store(path) if Path(tuned.store_path(path)).exists() else \
        {"version": tuned.FORMAT_VERSION, "configs": []}
    store = {**store, "configs": list(store.get("configs", []))}
    old = {tuple(e[k] for k in ("gpu", "kernel", "dtype", "head_dim", "causal", "seq_bucket")):
           e for e in store["configs"]}
    lines = []
    for e in entries:
        k = tuple(e[x] for x in ("gpu", "kernel", "dtype", "head_dim", "causal", "seq_bucket"))
        prev = old.get(k)
        what = "new" if prev is None else ("same" if prev.get("tiles") == e["tiles"]
                                           else f"was {_cfg_text(prev['tiles'])}")
        lines.append(f"{e['gpu']} {e['kernel']} {e['dtype']} D={e['head_dim']} "
                     f"{'causal' if e['causal'] else 'noncausal'} S<={e['seq_bucket']}: "
                     f"{_cfg_text(e['tiles'])} {e['tflops']:.1f} TFLOPS"
                     + (f" ({e['speedup_vs_default']:.3f}x default)"
                        if e.get("speedup_vs_default") else "") + f" [{what}]")
        store = tuned.upsert(store, e)
    if not entries:
        lines.append("no ok results to choose from: store unchanged")
    elif not dry_run:
        store.setdefault("description", "Best tile config per (gpu, kernel, dtype, head_dim, "
                         "causal, seq_bucket), written by `spak sweep --update-store` / `spak "
                         "store update`; read by spak.fmha through spak.tune.store.lookup.")
        store["configs"].sort(key=lambda e: (e["gpu"], e["kernel"], e["dtype"],
                                             e["head_dim"], e["causal"], e["seq_bucket"]))
        p = tuned.write_store(store, path)
        lines.append(f"wrote {len(store['configs'])} entries to {p}")
    return lines


def _cfg_text(t: dict) -> str:
    s = f"{t['TILE_M']}x{t['TILE_N']}"
    if t.get("occupancy") is not None:
        s += f"/o{t['occupancy']}"
    if t.get("num_ctas") is not None:
        s += f"/c{t['num_ctas']}"
    for k in sorted(set(t) - {"TILE_M", "TILE_N", "occupancy", "num_ctas"}):
        s += f"/{k}={t[k]}"
    return s


def format_store(store: dict) -> str:
    hdr = (f"{'gpu':<26} {'kernel':<6} {'dtype':<5} {'D':>4} {'causal':<6} {'bucket':>6} "
           f"{'config':<14} {'TFLOPS':>7} {'vs def':>7} {'date':<10} source")
    lines = [hdr]
    for e in store.get("configs", []):
        lines.append(f"{e['gpu'][:26]:<26} {e['kernel']:<6} {e['dtype']:<5} {e['head_dim']:>4} "
                     f"{'yes' if e['causal'] else 'no':<6} {e['seq_bucket']:>6} "
                     f"{_cfg_text(e['tiles']):<14} "
                     f"{e.get('tflops') or float('nan'):7.1f} "
                     f"{e.get('speedup_vs_default') or float('nan'):7.3f} "
                     f"{e.get('date') or '-':<10} {e.get('source') or '-'}")
    return "\n".join(lines)


def cmd_store(args) -> int:
    try:
        if args.action == "update":
            missing = [f for f in args.results if not Path(f).exists()]
            if missing:
                print(f"spak store: no such results file: {', '.join(missing)}",
                      file=sys.stderr)
                return 2
            for line in update_store(args.results, args.store, tiles_only=args.tiles_only,
                                     gpu=args.gpu, kernel=args.kernel, dry_run=args.dry_run):
                print(line)
            return 0
        if args.action == "show":
            print(format_store(tuned.load_store(args.store)))
            return 0
        if args.action == "lookup":
            causal = args.causal.lower() in ("yes", "true", "1", "causal")
            r = tuned.lookup(args.gpu_name, args.kernel_name, args.dtype, args.head_dim,
                             causal, args.seq_len, path=args.store, strict=True)
            print("none (spak.fmha uses gpu.plan.default_tiles)" if r is None else
                  _cfg_text(r) + f"  {r}")
            return 0
    except tuned.TunedStoreError as e:
        print(f"spak store: {e}", file=sys.stderr)
        return 1
    return 2


def register(subparsers) -> None:
    """Add `spak store`."""
    p = subparsers.add_parser(
        "store", help="the tuned-config store: update it from sweep results, show, look up",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--store", default=None,
                   help="store path (default: $SPAK_TUNED_CONFIGS or "
                        "spak/data/tuned_configs.json)")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    u = sub.add_parser("update", help="merge the best configs of sweep results into the store")
    u.add_argument("results", nargs="+", help="sweep results files (JSONL)")
    u.add_argument("--tiles-only", action="store_true",
                   help="only configs without occupancy/num_ctas hints compete")
    u.add_argument("--gpu", default=None, help="only this GPU's rows")
    u.add_argument("--kernel", default=None, help="only this kernel's rows")
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m spak.tune.choose")
    register(p.add_subparsers(dest="command"))
    args = p.parse_args(["store", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
