"""Where does the training step's host time go beyond forward + backward body? (issue 34d)

    python results/issue34-host-h200-2026-11-28/bwd_thread_cpu.py [N]

On the CPU with CUDA faked (spak.cpu.host_cost.fake_cuda: the launch is a recorder), time
per call (wall clock, best of 3 loops of N) of:
  step            spak.fmha(q, k, v, is_causal=True).backward(dout)   (engine on this thread)
  fwd             the forward that records the graph, output dropped
  bwd body        api._bwd_impl on the saved state (no autograd engine)
  fwd + node      the forward, then the backward node called directly under no_grad
                  (SPAK: o.grad_fn.apply(dout), i.e. _Train.backward without PyNode's C++
                  layer; SDPA: o.grad_fn(dout)): no engine, no AccumulateGrad
  step, worker    the same step, but .backward() run on a persistent second thread while
                  this one waits (what the CUDA engine does: a device thread runs the
                  graph and needs the GIL for our Python backward)
  handoff only    the same round trip to the worker with no work (queue + GIL + wake-ups)
and, for scale, the same rows for a C++ backward (SDPA's math kernel on CPU tensors).
Prints a table; no GPU, no file written.
"""
from __future__ import annotations

import queue
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def per_call(fn, n):
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


class Worker:
    """A persistent thread that runs the callables it is handed, one at a time."""

    def __init__(self):
        self.inq, self.outq = queue.SimpleQueue(), queue.SimpleQueue()
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            fn = self.inq.get()
            fn()
            self.outq.put(None)

    def run(self, fn):
        self.inq.put(fn)
        self.outq.get()


def rows(n):
    import torch
    import torch.nn.functional as F

    import spak
    from spak import api
    from spak.cpu.host_cost import fake_cuda
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 64, generator=g).half().requires_grad_() for _ in range(3))
    do = torch.randn(1, 2, 16, 64, generator=g).half()
    w = Worker()
    out = {}
    with fake_cuda():
        o = spak.fmha(q, k, v, is_causal=True)
        sq, sk, sv, so, slse, smask = o.grad_fn.saved_tensors
        scale = o.grad_fn.scale
        out["spak | step"] = per_call(lambda: spak.fmha(q, k, v, is_causal=True).backward(do), n)
        out["spak | fwd"] = per_call(lambda: spak.fmha(q, k, v, is_causal=True), n)
        out["spak | bwd body"] = per_call(
            lambda: api._bwd_impl(do, sq, sk, sv, so, slse, smask, True, scale), n)
        def node(o):
            with torch.no_grad():               # as on the engine's thread
                return o.grad_fn.apply(do)
        out["spak | fwd + node"] = per_call(lambda: node(spak.fmha(q, k, v, is_causal=True)), n)
        fast, real = [0], api._bwd_impl

        def counted(*a):                        # _Train.backward's plain-eager branch
            fast[0] += 1
            return real(*a)
        api._bwd_impl = counted
        try:
            spak.fmha(q, k, v, is_causal=True).backward(do)
            w.run(lambda: spak.fmha(q, k, v, is_causal=True).backward(do))
        finally:
            api._bwd_impl = real
        print(f"  _Train.backward took api._bwd_impl directly in {fast[0]} of 2 steps "
              "(this thread, worker thread)")
        out["spak | step, backward on worker"] = per_call(
            lambda: (lambda o: w.run(lambda: o.backward(do)))(
                spak.fmha(q, k, v, is_causal=True)), n)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    dof = do.float()

    def sdpa():
        return F.scaled_dot_product_attention(qf, kf, vf, is_causal=True)
    out["SDPA cpu | step"] = per_call(lambda: sdpa().backward(dof), n)
    out["SDPA cpu | fwd"] = per_call(sdpa, n)
    def cnode(o):
        with torch.no_grad():
            return o.grad_fn(dof)
    out["SDPA cpu | fwd + node"] = per_call(lambda: cnode(sdpa()), n)
    out["SDPA cpu | step, backward on worker"] = per_call(
        lambda: (lambda o: w.run(lambda: o.backward(dof)))(sdpa()), n)
    out["handoff only (empty task on worker)"] = per_call(lambda: w.run(lambda: None), n)
    return out


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    import torch
    print(f"torch {torch.__version__}, python {sys.version.split()[0]}, {n} calls, us/call")
    for name, us in rows(n).items():
        print(f"  {name:44s} {us:8.1f}")


if __name__ == "__main__":
    main()
