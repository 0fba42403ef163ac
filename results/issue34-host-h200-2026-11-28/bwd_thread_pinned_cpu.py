"""Issue 34d: the backward body and the step with the backward on a second thread, threads free vs both pinned to CPU 1 (CUDA faked; the project's 2-core box). Run: python results/issue34-host-h200-2026-11-28/bwd_thread_pinned_cpu.py 1000"""
import sys, os, torch
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent)); sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bwd_thread_cpu import per_call, Worker
import spak
from spak import api
from spak.cpu.host_cost import fake_cuda
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(1, 2, 16, 64, generator=g).half().requires_grad_() for _ in range(3))
do = torch.randn(1, 2, 16, 64, generator=g).half()
w = Worker(); n = int(sys.argv[1]); full = os.sched_getaffinity(0)
with fake_cuda():
    o = spak.fmha(q, k, v, is_causal=True)
    sq, sk, sv, so, slse, smask = o.grad_fn.saved_tensors
    body = lambda: api._bwd_impl(do, sq, sk, sv, so, slse, smask, True, o.grad_fn.scale)
    step = lambda: (lambda o: w.run(lambda: o.backward(do)))(spak.fmha(q, k, v, is_causal=True))
    for rep in range(2):
        for mode in ("free", "pinned cpu1"):
            cpu = {1} if mode != "free" else full
            os.sched_setaffinity(0, cpu); w.run(lambda: os.sched_setaffinity(0, cpu))
            print(rep, mode, "body main", round(per_call(body, n), 1), "body worker", round(per_call(lambda: w.run(body), n), 1),
                  "step(bwd on worker)", round(per_call(step, n), 1), "empty", round(per_call(lambda: w.run(lambda: None), n), 1), flush=True)
    os.sched_setaffinity(0, full); w.run(lambda: os.sched_setaffinity(0, full))
