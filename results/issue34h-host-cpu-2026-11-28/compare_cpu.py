"""CPU us per call (CUDA faked, the launch a no-op that keeps nothing) of the five cases,
from the repository root given as argv[1]; calls by SPAK's code and device-side counts."""
import json, os, sys, time
root = sys.argv[1]
sys.path.insert(0, root)
os.environ["SPAK_TUNED_CONFIGS"] = "/nonexistent/none.json"
import torch
import cuda.tile as ct
from spak.cpu import host_cost as hc
from spak import api
api.STORE_RECHECK_S = 1e9
res = {}
with hc.fake_cuda() as L:
    cases = hc.cases()
    for name, fn in cases.items():
        fn(); fn(); fn()
        L.clear()
        calls = hc.count_calls(fn)
        dev = hc.device_calls(fn)
        rec = ct.launch
        ct.launch = lambda stream, grid, kernel, args: None
        try:
            n = 400 if "bwd" in name else 3000
            for _ in range(50):
                fn()
            best = []
            for _ in range(5):
                t0 = time.process_time()
                for _ in range(n):
                    fn()
                best.append((time.process_time() - t0) / n * 1e6)
        finally:
            ct.launch = rec
        res[name] = {"us": round(min(best), 2), "calls": calls,
                     "alloc": dev["alloc"], "alloc_sized": dev.get("alloc_sized"),
                     "launch": dev["launch"], "tensor_arg": dev["tensor_arg"]}
print(json.dumps(res))
