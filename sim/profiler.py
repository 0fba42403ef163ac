"""Interpreter mode's `torch.profiler.profile(activities=[ProfilerActivity.CUDA])`.

Benchmarks time kernels with the profiler's CUDA activity (CUPTI): TileGym's benchmark_fn_cupti
sums `self_device_time_total` of the events in `prof.key_averages()` and refuses a run whose
total is 0; its _extract_kernel_times_from_profile names the dominant kernel. A CPU torch
refuses the CUDA activity ("Legacy CUDA profiling requires use_cpu=True"). While the simulated
GPU is on (sim.host_gpu), torch.profiler.profile is this subclass: the CUDA activity is
dropped from what torch profiles (the CPU activity stays), and key_averages() gains one CUDA
event per kernel launched inside the profile (sim.interpret), with the simulator's time on
this CPU as its device time -- never a GPU time (a launch restored by sim.launch_memo counts
its restore time).
"""
from __future__ import annotations

_state = {"saved": None, "active": []}


def note_launch(name: str, seconds: float) -> None:
    """Called by interpret.launch: a kernel ran for `seconds` (seen by open profiles)."""
    for log in _state["active"]:
        log.append((name, seconds))


def _kernel_events(launches):
    """One FunctionEventAvg per kernel name: count, total and self device time (us)."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEventAvg
    by_name: dict = {}
    for name, seconds in launches:
        ev = by_name.get(name)
        if ev is None:
            ev = by_name[name] = FunctionEventAvg()
            ev.key, ev.device_type, ev.use_device = name, DeviceType.CUDA, "cuda"
        ev.count += 1
        us = max(seconds * 1e6, 1e-3)
        ev.device_time_total += us
        ev.self_device_time_total += us
    return list(by_name.values())


def _profile_class(base):
    from torch.profiler import ProfilerActivity

    class SimProfile(base):
        """torch.profiler.profile; ProfilerActivity.CUDA reports simulated launches."""

        def __init__(self, *args, activities=None, **kwargs):
            acts = list(activities) if activities is not None else None
            self._sim_cuda = bool(acts) and ProfilerActivity.CUDA in acts
            if self._sim_cuda:
                acts = [a for a in acts if a != ProfilerActivity.CUDA] or [ProfilerActivity.CPU]
            kwargs.pop("use_cuda", None)
            self._sim_launches: list = []
            super().__init__(*args, activities=acts, **kwargs)

        def start(self):
            if self._sim_cuda:
                self._sim_launches = []
                _state["active"].append(self._sim_launches)
            return super().start()

        def stop(self):
            if self._sim_cuda and any(x is self._sim_launches for x in _state["active"]):
                _state["active"].remove(self._sim_launches)
            return super().stop()

        def key_averages(self, *args, **kwargs):
            events = super().key_averages(*args, **kwargs)
            if self._sim_cuda:
                events.extend(_kernel_events(self._sim_launches))
            return events

    return SimProfile


def enable() -> None:
    import torch.profiler
    if _state["saved"] is not None:
        return
    _state["saved"] = torch.profiler.profile
    torch.profiler.profile = _profile_class(_state["saved"])


def disable() -> None:
    import torch.profiler
    if _state["saved"] is None:
        return
    torch.profiler.profile = _state["saved"]
    _state["saved"] = None
    _state["active"].clear()
