"""The decode gate on the CPU, before any GPU time: what `spak run --family fmha_decode
--shapes SET` will do with each shape, and about how long it will take on one H200.

For every case of the selection (no GPU, no CUDA, no input data):

- the plan: the family's launches for the case on shape stand-ins (the sweep's CPU compile
  path, `FmhaDecode.stand_in_launches`, which plans through decode_gpu.decode_launches as
  `spak run` does), so a shape the planner rejects shows here; the row-tile form and the
  split count; the distinct JIT signatures (each one a compile on a cold cuTile cache);
- the peers: `spak.device.peers.gather` run on input sets of torch "meta" tensors shaped
  as decode_gpu.decode_gpu_inputs allocates, so each peer plug-in attaches or gives the
  note its row will carry (SDPA, TileGym, FlashInfer, the same-size copy);
- an estimate of the GPU wall time (the model below; --json for every field).

    python tools/decode_gate_plan.py --shapes models                # summary + estimate
    python tools/decode_gate_plan.py --shapes models-gate --table   # one line a case
    python tools/decode_gate_plan.py --shapes models --compile 2    # time 2 compiles here
    python tools/decode_gate_plan.py --shapes models-gate --precompile 10   # fill the cache

--precompile N (the GPU job, before or beside `spak run`): every case's launches built
for sm_90 into cuTile's disk cache by N CPU compile helpers (spak.tune.cpu_compile: no
CUDA context, no GPU work, so it may run while another process times kernels); a unit
it cannot build is left to `spak run`'s own first call. The timed rows' first_call_s
(~0.1-0.3 s on a cache hit, seconds on a compile) say whether it helped.

Time model (constants from the H200 run of `--kernel all --shapes models-small`,
results/issue33-h200-2026-11-28: 81 s for 14 shapes, 56 kernel cases, 5 peers): per shape
SPIN_S (time_turns' GPU spin) + SETUP_S (inputs, float64 reference, first calls, the
determinism call, peer checks) + REPEATS x providers timed x TURN_S, + SIM_S with the
simulator slice (--sim-work 2^29 "about a second"; a 16-core host), + COMPILE_S per new
JIT signature on a cold cuTile cache (--compile N measures it here; an H200 host's cores
are faster than this shared 2-core machine's). Process start: START_S.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SPIN_S, SETUP_S, TURN_S, SIM_S, COMPILE_S, START_S, REPEATS = 1.0, 1.0, 0.15, 1.5, 3.0, 15.0, 3


def meta_sets(p, n: int = 1) -> list[dict]:
    """Input sets of torch meta tensors with decode_gpu_inputs' shapes and dtypes."""
    import torch
    dt = torch.float16 if p.dtype == "fp16" else torch.bfloat16
    out = []
    for _ in range(n):
        q = torch.empty((p.B, p.Sq, p.Hq, p.D), dtype=dt, device="meta")
        if p.page:
            per = -(-p.Sk // p.page)
            kv = (p.B * per + 1, p.page, p.Hkv, p.D)
            table = torch.empty((p.B, per), dtype=torch.int32, device="meta")
        else:
            kv, table = (p.B, p.Sk, p.Hkv, p.D), None
        out.append({"q": q, "k_cache": torch.empty(kv, dtype=dt, device="meta"),
                    "v_cache": torch.empty(kv, dtype=dt, device="meta"),
                    "cache_seqlens": torch.empty((p.B,), dtype=torch.int32, device="meta"),
                    "block_table": table})
    return out


def plan_case(fam, p, kernel: str = "splitkv", arch: str = "sm_90") -> dict:
    """The case's launches on stand-ins: kernels, grids, splits and JIT signatures."""
    from spak.gpu.launch_sig import launch_signature
    from spak.tune.space import config_id
    cfg = fam.gpu_config(kernel, p, "cpu")
    unit = fam.compile_unit(kernel, p, cfg, config_id(cfg, fam.space_keys))
    launches = fam.stand_in_launches(unit, arch)
    sigs = [(getattr(L.kernel, "__name__", None) or str(L.kernel._pyfunc.__name__),
             launch_signature(L.kernel, L.args).symbol) for L in launches]
    return {"unit": unit, "launches": [(name, tuple(L.grid)) for (name, _), L in
                                       zip(sigs, launches)], "signatures": sigs}


def peers_of(fam, p) -> tuple[list, dict]:
    """(providers that attach, {plug-in: why not}) as `spak run` gathers them."""
    from spak.device import peers
    calls, notes = peers.gather(fam, p, meta_sets(p))
    return sorted(calls), notes


def estimate(n_providers: int, new_sigs: int, sim: bool) -> float:
    return (SPIN_S + SETUP_S + REPEATS * n_providers * TURN_S + (SIM_S if sim else 0.0)
            + COMPILE_S * new_sigs)


def survey(shapes, dtype: str, sim: bool) -> list[dict]:
    from spak.families.fmha_decode import FAMILY as fam
    seen: set = set()
    rows = []
    for p in fam.select(shapes, dtype=dtype):
        r = {"case": p.case_id, "model": p.model, "group": p.Hq // p.Hkv,
             "layout": f"page{p.page}" if p.page else "contiguous", "Sq": p.Sq,
             "ragged": p.ragged or p.lens is not None, "bytes": fam.bytes_moved(p)}
        try:
            plan = plan_case(fam, p)
            r["launches"] = plan["launches"]
            new = [s for s in plan["signatures"] if s not in seen]
            seen.update(new)
            r["new_signatures"] = len(new)
            r["tiles"] = plan["unit"]["config"]
        except Exception as exc:  # noqa: BLE001 -- the report's point: name the failure
            r["plan_error"] = f"{type(exc).__name__}: {exc}"[:300]
            r["new_signatures"] = 0
        r["peers"], r["peer_notes"] = peers_of(fam, p)
        # providers timed: ours + every attached peer (sdpa-efficient attaches but refuses
        # decode with GQA at its first call on the GPU: checked, not timed)
        timed = 1 + sum(1 for n in r["peers"] if n != "sdpa-efficient" or r["group"] == 1)
        r["providers_timed"] = timed
        r["est_s"] = estimate(timed, r["new_signatures"], sim)
        r["est_warm_s"] = estimate(timed, 0, sim)
        rows.append(r)
    return rows


def time_compiles(rows, n: int) -> list[float]:
    """Seconds to compile the first ``n`` cases' split kernels for sm_90 here."""
    from spak.families.fmha_decode import FAMILY as fam
    from spak.gpu.launch_sig import compile_to_cache
    out = []
    for r in [r for r in rows if "launches" in r][:n]:
        p = fam.parse(r["case"])
        launches = plan_case(fam, p)["unit"]
        L = fam.stand_in_launches(launches, "sm_90")[0]
        t0 = time.perf_counter()
        compile_to_cache(L, "sm_90")
        out.append(time.perf_counter() - t0)
    return out


def _helper_compile(unit) -> tuple:
    from spak.tune.cpu_compile import CpuCompiler
    global _COMPILER
    if _COMPILER is None:
        _COMPILER = CpuCompiler(block_torch=True)
    r = _COMPILER.compile(unit)
    return unit["case"], r["status"], r.get("seconds", 0.0), r.get("error")


_COMPILER = None


def precompile(shapes, dtype: str, jobs: int, arch: str = "sm_90", kernels=("splitkv",),
               tiles=None, configs=(None,)) -> int:
    """Every case's units (each of ``kernels``; "all": the family's; tiles (MAX_ROWS,
    TILE_N) as `spak run --tiles`; each of ``configs``, dicts of tiles knobs and num_splits
    over the run's config, as tools/decode_tiles_probe.py passes them) built into cuTile's
    disk cache by ``jobs`` CPU helpers; prints one line a unit and a total; returns the
    count that failed (left to the GPU call)."""
    import multiprocessing as mp
    from spak.families.fmha_decode import FAMILY as fam
    from spak.tune.space import config_id
    if "all" in kernels:
        kernels = fam.kernels
    units = {}
    for p in fam.select(shapes, dtype=dtype):
        for kernel in kernels:
            for extra in configs:
                cfg = {**fam.gpu_config(kernel, p, "cpu", tiles), **(extra or {})}
                cid = config_id(cfg, fam.space_keys) + ("" if not extra else
                                                        json.dumps(extra, sort_keys=True))
                u = fam.compile_unit(kernel, p, cfg, cid)
                if u is not None:
                    units[u["unit_id"]] = {**u, "family": fam.name, "arch": arch}
    t0, bad = time.perf_counter(), 0
    with mp.get_context("spawn").Pool(max(1, min(jobs, len(units)))) as pool:
        for case, status, secs, err in pool.imap_unordered(_helper_compile, units.values()):
            bad += status != "ok"
            print(f"{secs:6.1f} s  {status:<8} {case}" + (f"  {err[:120]}" if err else ""),
                  flush=True)
    print(f"precompiled {len(units) - bad}/{len(units)} units on the CPU in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    return bad


def summary(rows, sim: bool) -> list[str]:
    ok = [r for r in rows if "plan_error" not in r]
    peer_count = collections.Counter(n for r in rows for n in r["peers"])
    notes = collections.Counter(f"{k}: {v}" for r in rows for k, v in r["peer_notes"].items())
    with_peer = sum(1 for r in rows if set(r["peers"]) - {"copy"})
    cold = START_S + sum(r["est_s"] for r in rows)
    warm = START_S + sum(r["est_warm_s"] for r in rows)
    lines = [f"{len(rows)} cases: {len(ok)} planned, {len(rows) - len(ok)} plan errors; "
             f"{sum(r['new_signatures'] for r in rows)} distinct JIT signatures",
             f"cases with a peer other than the copy: {with_peer}; peers attached: "
             + ", ".join(f"{k} {v}" for k, v in sorted(peer_count.items())),
             "peer notes (cases):"]
    lines += [f"  {v:4d}  {k[:150]}" for k, v in notes.most_common()]
    lines.append(f"estimated GPU wall time, one H200, simulator {'on' if sim else 'off'}: "
                 f"{cold:.0f} s with a cold cuTile cache, {warm:.0f} s warm "
                 f"(model: tools/decode_gate_plan.py docstring)")
    for r in rows:
        if "plan_error" in r:
            lines.append(f"PLAN ERROR {r['case']}: {r['plan_error']}")
    return lines


def table_line(r) -> str:
    ln = " ".join(f"{n.replace('decode_', '').replace('_kernel', '')}{list(g)}"
                  for n, g in r.get("launches", []))
    return (f"{r['case']:<62} g{r['group']:<3} {ln or r.get('plan_error', '')[:40]:<36} "
            f"peers={','.join(r['peers']) or '-':<40} est {r['est_s']:5.1f} s")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["models"])
    ap.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="fp16")
    ap.add_argument("--sim", action="store_true", help="count the simulator slice (default: "
                    "--no-sim runs)")
    ap.add_argument("--table", action="store_true", help="one line a case")
    ap.add_argument("--compile", type=int, default=0, metavar="N",
                    help="time N split-kernel compiles for sm_90 on this CPU")
    ap.add_argument("--json", default=None, metavar="PATH", help="every case's fields")
    ap.add_argument("--precompile", type=int, default=0, metavar="JOBS",
                    help="only build every case's kernels into cuTile's disk cache with "
                         "JOBS CPU helpers (no survey)")
    ap.add_argument("--kernels", nargs="+", default=["splitkv"],
                    help="--precompile these kernels of the family (default splitkv; all)")
    ap.add_argument("--tiles", default=None, metavar="MxN",
                    help="--precompile with `spak run --tiles MxN` (MAX_ROWS x TILE_N)")
    ap.add_argument("--configs", nargs="+", default=None, metavar="JSON",
                    help="--precompile each of these configs (JSON dicts of tiles knobs and "
                         "num_splits, over the run's) for every shape")
    a = ap.parse_args(argv)
    if a.precompile:
        tiles = tuple(int(v) for v in a.tiles.lower().split("x")) if a.tiles else None
        configs = [json.loads(c) for c in a.configs] if a.configs else [None]
        return 1 if precompile(a.shapes, a.dtype, a.precompile, kernels=a.kernels,
                               tiles=tiles, configs=configs) else 0
    rows = survey(a.shapes, a.dtype, a.sim)
    if a.table:
        for r in rows:
            print(table_line(r))
    for line in summary(rows, a.sim):
        print(line)
    if a.compile:
        secs = time_compiles(rows, a.compile)
        print(f"compile here (sm_90, tileiras): " + ", ".join(f"{s:.1f}" for s in secs) + " s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    return 1 if any("plan_error" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
