"""Issue 34h on one GPU: the eager host cost of spak.fmha_kvcache and of a training step
(and the other entry points) against SDPA's backends, timed in interleaved blocks.

    source .carry/setup.sh && python tools/host_cost_i34h.py --out DIR [--blocks 9]
    python tools/host_cost_i34h.py --dry-run --blocks 2 --n 20   # on the CPU, CUDA faked

Why blocks: on the 16-core H200 host of 2026-11-28 09:43 the same row read up to 1.4x
apart in three rounds (SDPA cuDNN's kvcache row 17.8, 25.1, 25.6 us), and "best of
rounds" then compared one lucky round against another. Here each problem's rows (SPAK,
SDPA cuDNN / flash / default, and a few floors) are timed in turn, ``n`` calls each with
one synchronize, ``--blocks`` times over (odd blocks in reverse order), so that every
block of SPAK has a block of each SDPA backend next to it in time. The table gives each
row's median and best block, and SPAK's paired ratio to each SDPA row: the median over
blocks of (SPAK's block / that row's block of the same round).

Parts, each written to DIR/host_cost.json + host_cost.md as soon as it is done, each row
failing soft:
  1. the problems: spak.fmha_kvcache 1x1x32:8 x 256 keys (floors: its launch alone with
     out ready, ct.launch alone, one torch.empty_like); forward + backward 1x2x16x64
     causal (also: the gradients allocated by the backward, PREALLOC_BYTES 0; autograd's
     multithreading off, SPAK's and SDPA default's; floors: the step's 4 launches alone,
     its 5 allocations alone); spak.fmha 1x2x16x64 and
     4x16x512x64 causal (NVIDIA's sample when .peers has it); spak.fmha_varlen 2 seqs;
  2. checks against float64 (tools/host_cost_i34g.fmha_checks, host_cost_bench.gpu_checks:
     fwd+bwd gradients over 3 steps, the prepared path's LSE included, decode at 256/512
     keys, varlen), and a non-contiguous cache of a memoised shape still refused;
  3. launches, tensor arguments per call (host_cost_i34g.launch_counts).
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import host_cost_bench as hb  # noqa: E402
import host_cost_i34g as i34g  # noqa: E402


def kvcache_group(torch, dev) -> dict:
    """The decode problem's rows: SPAK, SDPA's backends (on the same data, [B, H, S, D]),
    and its floors."""
    import spak
    from spak import kvcache
    F = torch.nn.functional
    qd = hb._rand(torch, dev, 1, 1, 32, 64)
    kc, vc = (hb._rand(torch, dev, 1, 256, 8, 64) for _ in range(2))
    lens = torch.tensor([256], dtype=torch.int32, device=dev)
    t = "kvcache 1x1x32:8 x256"
    r = {f"{t} | spak": lambda: spak.fmha_kvcache(qd, kc, vc, lens)}
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (qd, kc, vc))
    r.update(hb._sdpa_rows(torch, F, t, lambda: F.scaled_dot_product_attention(
        qs, ks, vs, enable_gqa=True)))
    try:
        for _ in range(3):
            spak.fmha_kvcache(qd, kc, vc, lens)
        p = list(kvcache._READY.values())[-1]
        out = torch.empty_like(qd)
        tensors = (qd, kc, vc, lens, out, None)
        r[f"{t} | floor: its launch alone (out ready)"] = lambda: p.launch(tensors)
        r[f"{t} | floor: ct.launch alone (prepared args)"] = hb._one_split_launches(
            p, tensors)[0]
    except Exception as exc:                       # noqa: BLE001 -- the row says why
        r[f"{t} | floor: its launch alone (out ready)"] = _raiser(exc)
    r[f"{t} | floor: torch.empty_like(q)"] = lambda: torch.empty_like(qd)
    return r


def train_group(torch, dev) -> dict:
    """The training step's rows: SPAK and SDPA (autograd's multithreading on and off), and
    the step's launches and allocations alone."""
    import spak
    F = torch.nn.functional
    qg, kg, vg = (hb._rand(torch, dev, 1, 2, 16, 64, grad=True) for _ in range(3))
    do = hb._rand(torch, dev, 1, 2, 16, 64)

    def step():
        spak.fmha(qg, kg, vg, is_causal=True).backward(do)

    def sdpa_step():
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)
    t = "fwd+bwd 1x2x16x64 causal"
    r = {f"{t} | spak": step}
    r.update(hb._sdpa_rows(torch, F, t, sdpa_step))
    from spak import bwd_ready
    # issue 34g's preallocation A/B read 211.6 vs 205.3 us on one host and 262 vs 418 on
    # another (best of rounds): blocks settle it
    r[f"{t} | spak, grads allocated by the backward (PREALLOC_BYTES 0)"] = hb._with(
        hb._toggled([(bwd_ready, "PREALLOC_BYTES", 0)]), step)
    no_mt = lambda: torch.autograd.set_multithreading_enabled(False)   # noqa: E731
    r[f"{t} | spak, autograd multithreading off"] = hb._with(no_mt, step)
    r[f"{t} | SDPA default, autograd multithreading off"] = hb._with(no_mt, sdpa_step)
    try:
        launches, allocs = _train_floors(torch, spak, qg, kg, vg, do, step)
        r[f"{t} | floor: the step's 4 launches alone (prepared args)"] = launches
        r[f"{t} | floor: the step's 5 allocations alone (empty_like)"] = allocs
    except Exception as exc:                       # noqa: BLE001 -- the row says why
        r[f"{t} | floor: the step's launches alone"] = _raiser(exc)
    return r


def _train_floors(torch, spak, q, k, v, do, step):
    """(the step's four ct.launch calls with this step's arguments ready, its five
    allocations: out, LSE, dq, dk, dv as the prepared paths make them)."""
    from spak import api, bwd_ready
    for _ in range(3):
        step()
    args = next(a for key, a in api._VALIDATED.items()
                if key and key[0] == q.shape and a.train is not None)
    r, ready = args.train, list(bwd_ready._READY.values())[-1]
    gl = r.gl
    with torch.no_grad():
        out, lse = torch.empty_like(q), torch.empty_like(r.lse_like)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        fwd = (q.detach(), k.detach(), v.detach(), out, r.dummy, lse) + r.tail
        work = tuple(gl.workspaces(ready.layout, ready.device))
        pool = (q.detach(), k.detach(), v.detach(), out, do, lse, dq, dk, dv) + work \
            + ready.consts
        bwd = [(kernel, grid, get(pool)) for kernel, grid, get in ready.launches]
    stream = r.getstream(r.dev)

    def launches():
        gl.ct.launch(stream, r.grid, r.kernel, fwd)
        for kernel, grid, a in bwd:
            gl.ct.launch(stream, grid, kernel, a)

    def allocs():
        torch.empty_like(q)
        torch.empty_like(r.lse_like)
        torch.empty_like(q)
        torch.empty_like(k)
        torch.empty_like(v)
    return launches, allocs


def other_groups(torch, dev) -> list:
    """spak.fmha at both shapes and spak.fmha_varlen, each with SDPA's backends."""
    import spak
    F = torch.nn.functional
    groups = []
    for B, H, S in ((1, 2, 16), (4, 16, 512)):
        q, k, v = (hb._rand(torch, dev, B, H, S, 64) for _ in range(3))
        t = f"fmha {B}x{H}x{S}x64 causal"
        g = {f"{t} | spak": lambda q=q, k=k, v=v: spak.fmha(q, k, v, is_causal=True)}
        g.update(hb._sdpa_rows(torch, F, t, lambda q=q, k=k, v=v:
                               F.scaled_dot_product_attention(q, k, v, is_causal=True)))
        g[f"{t} | NVIDIA sample (+ torch.empty_like(out))"] = hb._sample_row(torch, q, k, v)
        groups.append(g)
    qv, kv, vv = (hb._rand(torch, dev, 40, 2, 64) for _ in range(3))
    cu = torch.tensor([0, 16, 40], dtype=torch.int32, device=dev)
    t = "varlen 2 seqs (16, 24) x2x64 causal"
    g = {f"{t} | spak": lambda: spak.fmha_varlen(qv, kv, vv, cu, cu, 24, 24, is_causal=True)}
    qp, kp, vp = (hb._rand(torch, dev, 2, 2, 24, 64) for _ in range(3))
    g.update(hb._sdpa_rows(torch, F, f"{t} (SDPA: padded 2x2x24)",
                           lambda: F.scaled_dot_product_attention(qp, kp, vp, is_causal=True)))
    groups.append(g)
    return groups


def _raiser(exc):
    return lambda: (_ for _ in ()).throw(exc)


def block_us(torch, row, n: int, sync) -> float:
    """us per call of one block: n calls of the row (hb.run_eager's forms: a function,
    (fn, SDPA backend), ("with", context factory, fn)), one synchronize; the row's context
    entered outside the timed loop, one untimed call first."""
    import contextlib
    cm, fn = contextlib.nullcontext(), row
    if isinstance(row, tuple) and row[0] == "with":
        cm, fn = row[1](), row[2]
    elif isinstance(row, tuple):
        fn, be = row
        if be is not None:
            from torch.nn.attention import sdpa_kernel
            cm = sdpa_kernel(be)
    with cm:
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        return (time.perf_counter() - t0) / n * 1e6


def interleaved(torch, group: dict, blocks: int, n: int, sync) -> dict:
    """name -> [us of each block] (a failed row: its error string); 30 warm-up calls per
    row first; odd blocks in reverse order."""
    seen: dict = {}
    for name, row in group.items():
        try:
            for _ in range(30):
                block_us(torch, row, 1, lambda: None)
            sync()
        except Exception as exc:                   # noqa: BLE001 -- the row says why
            seen[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    live = [name for name in group if name not in seen]
    for b in range(blocks):
        for name in (reversed(live) if b % 2 else live):
            if isinstance(seen.get(name), str):
                continue
            try:
                seen.setdefault(name, []).append(round(block_us(torch, group[name], n, sync), 2))
            except Exception as exc:               # noqa: BLE001
                seen[name] = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    return {name: seen.get(name, "failed: not timed") for name in group}   # group order


def summarize(blocks: dict) -> dict:
    """name -> {"median", "best", "blocks"} and, for SPAK's row, "vs <row>": the median of
    its per-block ratio to each SDPA row of the problem."""
    res = {}
    for name, us in blocks.items():
        if isinstance(us, str):
            res[name] = us
            continue
        res[name] = {"median": round(statistics.median(us), 2), "best": min(us),
                     "blocks": us}
    spak = [k for k in blocks if k.endswith("| spak")]
    for s in spak:
        problem = s.split(" | ")[0]
        for name, us in blocks.items():
            if name.startswith(problem) and " | SDPA " in name and "multithreading" not in \
                    name and not isinstance(us, str) and not isinstance(blocks[s], str):
                ratios = [a / b for a, b in zip(blocks[s], us)]
                res[s][f"vs {name.split(' | ')[-1]}"] = round(statistics.median(ratios), 3)
    mt = [k for k in blocks if "multithreading off" in k and not isinstance(blocks[k], str)]
    if len(mt) == 2:
        a, b = (blocks[k] for k in sorted(mt, key=lambda k: "SDPA" in k))
        res[sorted(mt, key=lambda k: "SDPA" in k)[0]]["vs SDPA default, mt off"] = round(
            statistics.median([x / y for x, y in zip(a, b)]), 3)
    return res


def markdown(meta, summary, checks) -> str:
    lines = [f"# Eager host cost per call, issue 34h ({meta['gpu']}, {meta['date']})", "",
             f"{meta['blocks']} interleaved blocks of {meta['n']} eager calls (training: "
             f"{meta['n_train']}), one synchronize per block; us per call. Ratio: the median "
             "over blocks of SPAK's block / that SDPA row's block (< 1: SPAK cheaper).", "",
             "| problem | provider | median | best | SPAK / SDPA (median of blocks) |",
             "|---|---|---:|---:|---|"]
    for name, s in summary.items():
        problem, who = name.split(" | ")[0], name.split(" | ")[-1]
        if isinstance(s, str):
            lines.append(f"| {problem} | {who} | {s} | | |")
            continue
        ratios = ", ".join(f"{k[3:]} {v}" for k, v in s.items() if k.startswith("vs "))
        lines.append(f"| {problem} | {who} | {s['median']} | {s['best']} | {ratios} |")
    lines += ["", "Checks and counts:", ""] + [f"- {k}: {v}" for k, v in checks.items()]
    return "\n".join(lines) + "\n"


def noncontiguous_check(torch, dev) -> dict:
    """A non-contiguous cache of a memoised shape still raises validate()'s ValueError."""
    import spak
    name = "check | kvcache: a non-contiguous cache of a memoised shape is refused"
    try:
        q = hb._rand(torch, dev, 1, 1, 8, 64)
        kc, vc = (hb._rand(torch, dev, 1, 64, 2, 64) for _ in range(2))
        lens = torch.tensor([64], dtype=torch.int32, device=dev)
        for _ in range(3):
            spak.fmha_kvcache(q, kc, vc, lens)
        bad = kc.transpose(1, 2).contiguous().transpose(1, 2)
        try:
            spak.fmha_kvcache(q, bad, vc, lens)
            res = {"pass": False, "error": None}
        except ValueError as exc:
            res = {"pass": "must be contiguous" in str(exc), "error": str(exc)[:100]}
    except Exception as exc:                       # noqa: BLE001
        res = f"failed: {type(exc).__name__}: {str(exc)[:160]}"
    print(f"  {name}: {res}", flush=True)
    return {name: res}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="host_cost_out")
    ap.add_argument("--n", type=int, default=1000, help="calls per block")
    ap.add_argument("--n-train", type=int, default=300, help="training steps per block")
    ap.add_argument("--blocks", type=int, default=9)
    ap.add_argument("--dry-run", action="store_true", help="on the CPU, CUDA faked")
    args = ap.parse_args(argv)
    import torch
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        return _dry_run(torch, args)
    dev = torch.device("cuda")
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "n": args.n,
            "n_train": args.n_train, "blocks": args.blocks,
            "python": platform.python_version(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(f"{meta['gpu']} torch {meta['torch']} {meta['date']}; us per eager call:",
          flush=True)
    sync = torch.cuda.synchronize
    summary, checks = {}, {}

    def group(make, n):
        got = interleaved(torch, make(), args.blocks, n, sync)
        s = summarize(got)
        summary.update(s)
        for name, v in s.items():
            print(f"  {name:<70} " + (v if isinstance(v, str) else
                  f"median {v['median']:8.2f} best {v['best']:8.2f} " + " ".join(
                      f"{k}={x}" for k, x in v.items() if k.startswith("vs "))), flush=True)
    parts = [lambda: group(lambda: kvcache_group(torch, dev), args.n),
             lambda: group(lambda: train_group(torch, dev), args.n_train)]
    parts += [lambda g=g: group(lambda: g, args.n) for g in _lazy(other_groups, torch, dev)]
    parts += [lambda: checks.update(i34g.fmha_checks(torch, dev)),
              lambda: checks.update(hb.gpu_checks(torch, dev)),
              lambda: checks.update(noncontiguous_check(torch, dev)),
              lambda: checks.update(i34g.launch_counts(torch, i34g._cases(torch, dev)))]
    t0 = time.perf_counter()
    for i, part in enumerate(parts):
        try:
            part()
            print(f"  (part {i} done at {time.perf_counter() - t0:.0f} s)", flush=True)
        except Exception:                          # noqa: BLE001 -- the next part runs
            traceback.print_exc()
        _write(out, meta, summary, checks)
    print("\n" + markdown(meta, summary, checks))
    return 0


def _lazy(make, torch, dev) -> list:
    try:
        return make(torch, dev)
    except Exception:                              # noqa: BLE001 -- the other parts run
        traceback.print_exc()
        return []


def _write(out, meta, summary, checks) -> None:
    (out / "host_cost.json").write_text(json.dumps(
        {"meta": meta, "eager_us": summary, "checks": checks}, indent=1))
    (out / "host_cost.md").write_text(markdown(meta, summary, checks))


def _dry_run(torch, args) -> int:
    """The groups on CPU tensors under spak.cpu.host_cost.fake_cuda (SDPA's pinned
    backends and the sample need a GPU: those rows fail soft), and the counts."""
    from spak.cpu import host_cost as hc
    dev = torch.device("cpu")
    meta = {"gpu": "dry run (CPU, CUDA faked)", "n": args.n, "n_train": args.n_train,
            "blocks": args.blocks, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    summary, checks = {}, {}
    with hc.fake_cuda():
        for group in [kvcache_group(torch, dev), train_group(torch, dev),
                      *other_groups(torch, dev)]:
            summary.update(summarize(interleaved(torch, group, args.blocks, args.n,
                                                 lambda: None)))
        checks.update(noncontiguous_check(torch, dev))
        checks.update(i34g.launch_counts(torch, i34g._cases(torch, dev)))
    _write(Path(args.out), meta, summary, checks)
    print(markdown(meta, summary, checks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
