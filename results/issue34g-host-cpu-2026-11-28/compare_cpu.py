"""CPU us per call (process_time, best of 3 x n) of hc.cases() in the tree given as argv[1]."""
import os, sys, time
root = sys.argv[1]; sys.path.insert(0, root); os.chdir(root)
os.environ["SPAK_TUNED_CONFIGS"] = "/nonexistent/none.json"
import torch
from spak import api
from spak.cpu import host_cost as hc
api.STORE_RECHECK_S = 1e9
only = sys.argv[2] if len(sys.argv) > 2 else ""
with hc.fake_cuda():
    for name, fn in hc.cases().items():
        if only not in name: continue
        n = 300 if "bwd" in name else 2000
        cpu = hc.per_call_us(fn, n, repeats=5, clock=time.process_time)
        wall = hc.per_call_us(fn, n, repeats=5)
        print(f"{name:<42} {cpu:7.2f} us cpu {wall:7.2f} us wall", flush=True)
