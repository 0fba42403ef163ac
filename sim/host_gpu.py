"""Interpreter mode's simulated GPU as host code sees it: `torch.cuda` on a CPU build of torch.

Programs and test suites written for a GPU ask torch about it before and around every launch:
TileGym's conftest reads `torch.cuda.get_device_capability('cuda')`, its setUp calls
`torch.cuda.empty_cache()` and `torch.cuda.manual_seed()`, benchmarks time with
`torch.cuda.Event`. On a CPU torch those raise "Torch not compiled with CUDA enabled". While
this emulation is on (interpret.enable(cuda_as_cpu=True), SPAK_SIM_CUDA_AS_CPU=1, the pytest
plugin, `python -m spak.sim`), `torch.cuda` answers as one simulated GPU of the launch model
(sim_90: an H100 SXM, 132 SMs, 80 GiB) whose memory is the CPU's:

- is_available() True, device_count() 1, current_device() 0, set_device(0 / "cuda:0"),
  `torch.cuda.device(0)` as a context; get_device_name/capability/properties;
- synchronize(), empty_cache(), ipc_collect(): nothing to do (every launch has finished
  when ct.launch returns); manual_seed(_all)/seed/initial_seed: the CPU generator, which
  is the one that fills tensors created "on cuda" here; get/set_rng_state likewise;
- Stream / current_stream / default_stream / stream(s): one stream that is always idle;
  Event(enable_timing=True).elapsed_time gives host wall time between records (the
  simulator's time, not a GPU's: documented, never a GPU figure);
- memory statistics: memory_allocated / max_memory_allocated / memory_reserved / reset_*
  answer 0 (the simulator does not count device bytes), mem_get_info the model's 80 GiB.

`torch.cuda._sleep` (a GPU spin that only delays the stream) and
`torch._C._cuda_clearCublasWorkspaces` do nothing. CUDA graphs (CUDAGraph, graph,
graph_pool_handle, is_current_stream_capturing) are recorded and replayed by sim.cuda_graph;
torch.profiler's CUDA activity reports the simulated launches (sim.profiler).
What cannot be emulated raises SimNotSupported naming it (make_graphed_callables).
"""
from __future__ import annotations

import time
import types

from . import cuda_graph, profiler
from .errors import SimNotSupported

# (compute capability, SM count, name) per model: an H100 SXM, an RTX 5070 and an L4
GPUS = {"sm_90": ((9, 0), 132, "NVIDIA H100 (spak sim sm_90)", 80),
        "sm_120": ((12, 0), 48, "NVIDIA GeForce RTX 5070 (spak sim sm_120)", 12),
        "sm_89": ((8, 9), 58, "NVIDIA L4 (spak sim sm_89)", 24)}

_saved: dict = {}


def properties(model: str):
    cap, sms, name, gib = GPUS.get(model, GPUS["sm_90"])
    return types.SimpleNamespace(
        name=name, major=cap[0], minor=cap[1], multi_processor_count=sms,
        total_memory=gib * 2**30, L2_cache_size=50 * 2**20 if cap == (9, 0) else 32 * 2**20,
        max_threads_per_multi_processor=2048 if cap != (8, 9) else 1536,
        warp_size=32, regs_per_multiprocessor=65536, is_integrated=False,
        is_multi_gpu_board=False, uuid="spak-sim-0", gcnArchName="", pci_bus_id=0,
        pci_device_id=0, pci_domain_id=0, shared_memory_per_block_optin=227 * 1024,
        shared_memory_per_multiprocessor=228 * 1024, shared_memory_per_block=48 * 1024)


def _device_index(device) -> int:
    """0 for the one simulated device; anything else names a device that does not exist."""
    import torch
    if device is None:
        return 0
    if isinstance(device, int):
        idx = device
    elif isinstance(device, str):
        if not (device == "cuda" or device.startswith("cuda:")):
            raise ValueError(f"spak sim: expected a CUDA device, got {device!r}")
        idx = int(device.split(":", 1)[1]) if ":" in device else 0
    elif isinstance(device, torch.device):
        idx = device.index or 0
    else:
        idx = getattr(device, "idx", 0) or 0
    if idx not in (0, -1):
        raise ValueError(f"spak sim: the simulated GPU is device 0 (device_count() == 1); "
                         f"device {device!r} does not exist")
    return 0


class Stream:
    """The simulated GPU's one stream: every launch has finished when ct.launch returns."""

    def __init__(self, device=None, priority=0, **_):
        self.device = device
        self.priority = priority
        self.cuda_stream = 0

    def wait_stream(self, stream):
        return None

    def wait_event(self, event):
        return None

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def query(self):
        return True

    def synchronize(self):
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __eq__(self, other):
        return isinstance(other, Stream)

    def __hash__(self):
        return 0


class Event:
    """record() notes host wall time; elapsed_time() in ms between two records (what the
    simulator took on this CPU -- never a GPU time)."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, **_):
        self.enable_timing = enable_timing
        self._t = None

    def record(self, stream=None):
        self._t = time.perf_counter()

    def wait(self, stream=None):
        return None

    def query(self):
        return True

    def synchronize(self):
        return None

    def elapsed_time(self, end):
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'")
        if self._t is None or end._t is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time")
        return (end._t - self._t) * 1e3


_STREAM = Stream()


class _DeviceContext:
    def __init__(self, device):
        _device_index(device)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _unsupported(what):
    def f(*a, **k):
        raise SimNotSupported(f"spak sim: {what} cannot be emulated on the CPU simulator "
                              "(interpreter mode runs each ct.launch when it is called)")
    return f


def _namespace(model, stream_value):
    import torch
    props = properties(model)
    gen = torch.default_generator
    zero = lambda device=None: 0          # noqa: E731 -- the simulator counts no device bytes
    none = lambda *a, **k: None           # noqa: E731
    return {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": none,
        "device_count": lambda: 1,
        "current_device": lambda: 0,
        "set_device": lambda device: (_device_index(device), None)[1],
        "device": _DeviceContext,
        "get_device_name": lambda device=None: (_device_index(device), props.name)[1],
        "get_device_capability": lambda device=None: (_device_index(device),
                                                      (props.major, props.minor))[1],
        "get_device_properties": lambda device=None: (_device_index(device), props)[1],
        "get_arch_list": lambda: [f"sm_{props.major}{props.minor}"],
        "synchronize": lambda device=None: (_device_index(device), None)[1],
        "empty_cache": none, "ipc_collect": none,
        "manual_seed": lambda seed: gen.manual_seed(int(seed)) and None,
        "manual_seed_all": lambda seed: gen.manual_seed(int(seed)) and None,
        "seed": lambda: gen.seed() and None, "seed_all": lambda: gen.seed() and None,
        "initial_seed": lambda: gen.initial_seed(),
        "get_rng_state": lambda device="cuda": gen.get_state(),
        "set_rng_state": lambda state, device="cuda": gen.set_state(state),
        "get_rng_state_all": lambda: [gen.get_state()],
        "set_rng_state_all": lambda states: gen.set_state(states[0]),
        "Stream": Stream, "Event": Event,
        "current_stream": lambda device=None: stream_value,
        "default_stream": lambda device=None: stream_value,
        "stream": lambda s=None: s if s is not None else _STREAM,
        "set_stream": none,
        "memory_allocated": zero, "max_memory_allocated": zero, "memory_reserved": zero,
        "max_memory_reserved": zero, "memory_cached": zero, "max_memory_cached": zero,
        "reset_peak_memory_stats": none, "reset_max_memory_allocated": none,
        "reset_max_memory_cached": none, "reset_accumulated_memory_stats": none,
        "memory_stats": lambda device=None: {"allocated_bytes.all.current": 0,
                                             "allocated_bytes.all.peak": 0},
        "memory_summary": lambda device=None, abbreviated=False: "spak sim: no device memory",
        "mem_get_info": lambda device=None: (props.total_memory, props.total_memory),
        "CUDAGraph": cuda_graph.CUDAGraph, "graph": cuda_graph.graph,
        "graph_pool_handle": cuda_graph.graph_pool_handle,
        "is_current_stream_capturing": cuda_graph.is_current_stream_capturing,
        "make_graphed_callables": _unsupported("torch.cuda.make_graphed_callables"),
        "_sleep": none,                    # a GPU spin only delays the stream
    }


def enable(model="sm_90", stream_value=None) -> bool:
    """Install the emulation (idempotent); False on a torch that has CUDA (never pretend)."""
    if _saved:
        return True
    try:
        import torch
    except ImportError:
        return False
    if torch.cuda.is_available():
        return False
    ns = _namespace(model, stream_value)
    missing = object()
    for name, fn in ns.items():
        _saved[name] = getattr(torch.cuda, name, missing)
        setattr(torch.cuda, name, fn)
    _saved["__missing__"] = missing
    # benchmarks call it; replaced on a CUDA build too (CUDA hidden: no cuBLAS state to clear,
    # and the real call must not be the first to touch the absent device)
    _saved["__c__"] = getattr(torch._C, "_cuda_clearCublasWorkspaces", missing)
    torch._C._cuda_clearCublasWorkspaces = lambda: None
    profiler.enable()                   # ProfilerActivity.CUDA: the simulated launches
    return True


def disable() -> None:
    if not _saved:
        return
    import torch
    profiler.disable()
    missing = _saved.pop("__missing__")
    c = _saved.pop("__c__", missing)
    if c is missing:
        del torch._C._cuda_clearCublasWorkspaces
    else:
        torch._C._cuda_clearCublasWorkspaces = c
    for name, fn in _saved.items():
        if fn is missing:
            delattr(torch.cuda, name)
        else:
            setattr(torch.cuda, name, fn)
    _saved.clear()


def is_enabled() -> bool:
    return bool(_saved)
