import os, sys
sys.path.insert(0, os.getcwd())
os.environ["SPAK_TUNED_CONFIGS"] = "/nonexistent/none.json"
import torch
from spak import api, bwd_ready
from spak.cpu import host_cost as hc
api.STORE_RECHECK_S = 1e9
with hc.fake_cuda() as L:
    for name, fn in hc.cases().items():
        fn(); fn(); fn()
        ours, anywhere = hc.count_calls(fn), hc.count_calls(fn, where="")
        d = hc.device_calls(fn)
        extra = ""
        if "bwd" in name:
            extra = f" bwd-thread {hc.count_calls(fn, where='', inside=api._Train.backward.__code__)}"
        print(f"{name:<42} ours {ours:3d} anywhere {anywhere:3d} {d}{extra}")
