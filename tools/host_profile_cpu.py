"""The entry points' host path on the CPU, CUDA faked and the launch a no-op
(spak.cpu.host_cost): us per call, calls per call, launches per call, and a cProfile of
each (top functions by own time).

    python tools/host_profile_cpu.py [--n 2000] [--top 25] [--only fmha_kvcache]
"""
from __future__ import annotations

import argparse
import cProfile
import platform
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--only", default="", help="cases whose name contains this")
    args = ap.parse_args(argv)
    import torch

    from spak.cpu import host_cost as hc
    print(f"{platform.node()} {platform.processor() or platform.machine()} python "
          f"{platform.python_version()} torch {torch.__version__} "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; loop of {args.n}")
    from spak import api
    if hasattr(api, "STORE_RECHECK_S"):      # no store stat() inside a count (issue 34)
        api.STORE_RECHECK_S = 1e9
    profiles = []
    with hc.fake_cuda() as launches:
        for name, fn in hc.cases().items():
            if args.only not in name:
                continue
            fn()
            launches.clear()
            calls = hc.count_calls(fn)
            n_launch = len(launches)
            us = hc.per_call_us(fn, args.n)
            cpu = hc.per_call_us(fn, args.n, clock=time.process_time)
            print(f"  {name:<42} {us:8.1f} us wall {cpu:8.1f} us cpu  {calls:5d} calls  "
                  f"{n_launch} launches", flush=True)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(args.n // 4):
                fn()
            prof.disable()
            profiles.append((name, top_table(prof, args.n // 4, args.top)))
    for name, text in profiles:
        print(f"\n=== {name}: cProfile of {args.n // 4} calls, by own time, us per call "
              f"(cProfile's own overhead included)\n{text}")


def top_table(prof, calls: int, top: int) -> str:
    """The ``top`` functions by own time: calls, own and cumulative us per entry-point call."""
    st = pstats.Stats(prof).stats
    rows = sorted(st.items(), key=lambda kv: -kv[1][2])[:top]
    lines = [f"{'n/call':>7} {'own us':>8} {'cum us':>8}  function"]
    for (path, line, func), (cc, nc, tt, ct, _) in rows:
        where = f"{Path(path).name}:{line}" if path != "~" else ""
        lines.append(f"{nc / calls:7.2f} {tt / calls * 1e6:8.2f} {ct / calls * 1e6:8.2f}  "
                     f"{where}({func})")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
