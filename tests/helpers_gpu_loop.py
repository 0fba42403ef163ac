"""What the GPU-loop tests on the CPU share (tests/test_gpu_loop_cpu.py,
tests/test_bwd_loop_cpu.py, tests/test_sweep.py, tests/test_decode_forms.py): torch.cuda's
timing calls on the host clock, the sweep worker's GpuRunner on the CPU, the `spak run`
arguments and environment of a simulated GPU, and `spak run`'s environment probes replaced
so the command runs on the CPU."""
from __future__ import annotations

import time
import types


class HostEvent:
    """torch.cuda.Event on the host clock; every record() is logged in HostEvent.log
    (a fixture that reads the log resets it)."""
    log: list = []

    def __init__(self, enable_timing=True):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()
        HostEvent.log.append("record")

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


def stub_cuda_timing(monkeypatch, torch, sleep=lambda n: None, **more) -> None:
    """torch.cuda's Event, synchronize, _sleep and empty_cache (and `more`) replaced."""
    stubs = {"Event": HostEvent, "synchronize": lambda *a: None, "_sleep": sleep,
             "empty_cache": lambda: None, **more}
    for name, val in stubs.items():
        monkeypatch.setattr(torch.cuda, name, val, raising=False)


def cpu_sweep_runner(monkeypatch, torch, l2_bytes: int = 1 << 20):
    """The sweep worker's GpuRunner on the CPU device, torch.cuda's timing and device
    queries stubbed (a simulated sm_90 with 132 SMs and an ``l2_bytes`` L2), 2 input sets
    at most; the caller replaces its ``ct`` launch."""
    from spak.tune import worker as swk
    stub_cuda_timing(monkeypatch, torch, current_stream=lambda *a: "stream",
                     get_device_capability=lambda *a: (9, 0),
                     get_device_name=lambda *a: "Sim GPU",
                     get_device_properties=lambda *a: types.SimpleNamespace(
                         L2_cache_size=l2_bytes, multi_processor_count=132))
    return swk.GpuRunner({"device": "cpu", "warmup": 1, "batches": 2, "batch_ms": 1.0,
                          "max_sets": 2})


def run_args(**kw) -> types.SimpleNamespace:
    """`spak run`'s parsed options for spak.device.case.run_case, with `kw` overriding."""
    base = dict(no_time=True, no_sim=False, no_sdpa=False, max_sets=2, seed=0,
                naive_max_gb=16.0, tiles=None, model="sm_90", sim_heads=1,
                sim_work=1 << 29, dump=None)
    return types.SimpleNamespace(**{**base, **kw})


def sim_env() -> types.SimpleNamespace:
    """The RunEnv of a simulated sm_90 GPU with a small L2 (on the CPU device)."""
    return types.SimpleNamespace(base={"schema": "spak.run/2", "gpu": "Sim GPU"},
                                 arch="sm_90", l2_bytes=1 << 16, device="cpu", dump={})


def patch_run_env(monkeypatch, torch) -> None:
    """`spak run` on the CPU: no GPU check, sim_env() as its RunEnv, no set-up diagnosis."""
    from spak.device import env as gpu_env, gpurun

    class Env:
        def __init__(self, argv):
            self.__dict__.update(vars(sim_env()))
            self.gpu = "Sim GPU"
            self.base = {**self.base, "torch": torch.__version__, "cuda_tile": None,
                         "command": "spak " + " ".join(argv)}
    monkeypatch.setattr(gpurun, "gpu_missing", lambda: None)
    monkeypatch.setattr(gpurun, "RunEnv", Env)
    monkeypatch.setattr(gpu_env, "diagnose", lambda **kw: [])
