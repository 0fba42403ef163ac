"""Issue 34e's prepared paths against the former ones on the CPU (CUDA faked, the launch a
recorder: spak.cpu.host_cost), in one process, interleaved rounds: CPU us per call.

    python tools/host_ab_cpu.py [--rounds 4]

The former paths are switched back on in the process (spak.kvcache.PREPARED,
spak.varlen.PREPARED, spak.bwd_ready.ENABLED = False); the decode kernel change (6 tensor
arguments instead of 9) is not in these figures (the fake launch costs nothing per
argument). tools/host_cost_bench.py --ab measures both on a GPU.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CASES = ("fmha fwd+bwd 1x2x16x64 causal", "fmha_kvcache 1x1x32:8 x256",
         "fmha_varlen 2 seqs (16, 24) x2x64 causal")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args(argv)
    os.environ["SPAK_TUNED_CONFIGS"] = "/nonexistent/none.json"       # default configs
    from spak import api, bwd_ready, kvcache, varlen
    from spak.cpu import host_cost as hc
    api.STORE_RECHECK_S = 1e9
    res: dict = {}
    with hc.fake_cuda():
        cases = hc.cases()
        for _ in range(args.rounds):
            for new in (True, False):
                kvcache.PREPARED = varlen.PREPARED = bwd_ready.ENABLED = new
                for name in CASES:
                    n = 300 if "bwd" in name else 1000
                    us = hc.per_call_us(cases[name], n, repeats=3, clock=time.process_time)
                    res.setdefault((name, new), []).append(round(us, 1))
        kvcache.PREPARED = varlen.PREPARED = bwd_ready.ENABLED = True
    for name in CASES:
        old, new = res[(name, False)], res[(name, True)]
        print(f"{name:<42} old {min(old):7.1f}  new {min(new):7.1f} us (best of {old} / {new})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
