"""Interpreter mode: cuTile's own `ct.launch(stream, grid, kernel, args)` runs the kernel on
the simulator, so existing host code runs on a CPU with CPU tensors or numpy arrays.

    import spak.sim
    spak.sim.enable()                  # or SPAK_SIM=1 in the environment, or
                                       # python -m spak.sim script.py [args]
    ct.launch(None, grid, kernel, (x_cpu, y_cpu, 128))

`stream` is ignored (the simulator runs launches one after another). Arrays: numpy
arrays, and torch CPU tensors (shared with the kernel, no copy; bfloat16 tensors are
copied in and written back after the launch). A CUDA tensor raises: pass CPU tensors.
On a torch without CUDA, `torch.cuda.current_stream()`, `get_device_capability()` and
`get_device_properties()` answer as the simulated GPU while enabled, so host code written
for the GPU (NVIDIA's samples, TileGym's ops) runs when it has no `is_cuda` checks
(tensor_is_cuda=True covers those) and allocates on the inputs' device (cuda_as_cpu=True
covers `device="cuda"` by name). Breakpoints and `print`/`ct.printf` work inside kernels:
the kernel's own Python body runs, one block (or one lock-step group of blocks) at a time.
"""
from __future__ import annotations

import os

import numpy as np
import cuda.tile as ct

from . import cuda_as_cpu as _cuda_as_cpu
from . import cuda_graph, dtypes, launch_memo, profiler
from .memory import SimArray

_state = {"real": None, "options": {}, "stream": None, "is_cuda": False}
# launches run in interpreter mode and the seconds the simulator spent in them (the pytest
# plugin's summary: how much of a suite's time is the simulator's)
stats = {"launches": 0, "seconds": 0.0}




def enable(*, model="sm_90", check=True, mode="auto", cpu_stream=True,
           tensor_is_cuda=None, undetermined_padding=None, cuda_as_cpu=None,
           interpreter_summary=False) -> None:
    """Make `cuda.tile.launch` run kernels on the simulator (sim.launch options).

    cpu_stream: on a torch without CUDA, the host-side queries GPU code makes answer as
    the simulated GPU until disable(): `torch.cuda.current_stream()` gives None (what
    NVIDIA's samples pass to ct.launch), `get_device_capability()` the model's arch
    (sm_90: (9, 0)) and `get_device_properties()` its name and SM count.
    `torch.cuda.is_available()` stays False.

    tensor_is_cuda: also make `tensor.is_cuda` answer True for CPU tensors until
    disable(), so host code that refuses non-CUDA tensors (`if not x.is_cuda: raise`, as
    most of NVIDIA's samples do) runs unchanged; off by default, on with
    SPAK_SIM_IS_CUDA=1 (torch's own C++ code never reads this Python attribute).

    undetermined_padding: "poison" (NaN / int max, the simulator's default: finds kernels
    that depend on it) or "zero" (as the H100 filled them for TileGym's attention_sink);
    None leaves the current setting (sim.memory.set_undetermined_padding).

    cuda_as_cpu: on a CPU torch, torch calls that name a CUDA device (`device="cuda"`,
    `.cuda()`, `.to("cuda")`) get the CPU instead and `torch.cuda.synchronize()` does nothing,
    until disable() (sim/cuda_as_cpu.py): for host code that allocates on "cuda" by name.
    With it `torch.cuda` presents the simulated GPU (is_available() True, its properties,
    seeds, streams, events, memory statistics: sim/host_gpu.py), host<->device moves stay
    copies, and SDPA may use the CPU math backend. Off by default, on with
    SPAK_SIM_CUDA_AS_CPU=1 (and in `python -m spak.sim` and the pytest plugin).

    interpreter_summary: print the out-of-bounds findings (sim.oob) at exit (on in
    `python -m spak.sim` and with SPAK_SIM=1; the pytest plugin prints its own)."""
    if _state["real"] is None:
        _state["real"] = (ct.launch, ct.tune.exhaustive_search)
    _state["options"] = {"model": model, "check": check, "mode": mode}
    ct.launch = launch
    ct.tune.exhaustive_search = exhaustive_search
    if cpu_stream and _state["stream"] is None:
        _shim_torch_cuda(_model_name(model))
    if undetermined_padding is not None:
        from .memory import set_undetermined_padding
        set_undetermined_padding(undetermined_padding)
    if tensor_is_cuda is None:
        tensor_is_cuda = os.environ.get("SPAK_SIM_IS_CUDA", "") not in ("", "0")
    if tensor_is_cuda and not _state["is_cuda"]:
        _shim_is_cuda()
    if cuda_as_cpu is None:
        cuda_as_cpu = os.environ.get("SPAK_SIM_CUDA_AS_CPU", "") not in ("", "0")
    if cuda_as_cpu:
        _cuda_as_cpu.enable(_model_name(model))
    if interpreter_summary:
        from . import oob
        oob.install_exit_summary()
        _install_launch_summary()


def _install_launch_summary():
    """At exit: launches simulated and the launch memo's hits (interpreter mode's summary)."""
    if _state.get("summary"):
        return
    import atexit
    import sys
    _state["summary"] = True
    atexit.register(lambda: stats["launches"] and print(
        f"spak sim: {stats['launches']} kernel launch(es) in {stats['seconds']:.1f} s; "
        f"{launch_memo.summary()}", file=sys.stderr))


def _model_name(model) -> str:
    return model if isinstance(model, str) else getattr(model, "name", "sm_90")


def _shim_is_cuda():
    try:
        import torch  # lazily, as _shim_torch_cuda
    except ImportError:
        return
    if torch.cuda.is_available():
        return                  # real CUDA tensors exist: keep the truth
    torch.Tensor.is_cuda = property(lambda self: True)
    _state["is_cuda"] = True


_SHIMMED = ("current_stream", "get_device_capability", "get_device_properties")


def _shim_torch_cuda(model):
    try:
        import torch  # lazily: sim/ never needs torch, host code that uses it does
    except ImportError:
        return
    if torch.cuda.is_available():
        return
    from .host_gpu import properties
    props = properties(model)
    cap = (props.major, props.minor)
    _state["stream"] = {n: getattr(torch.cuda, n) for n in _SHIMMED}
    torch.cuda.current_stream = lambda device=None: None
    torch.cuda.get_device_capability = lambda device=None: cap
    torch.cuda.get_device_properties = lambda device=None: props


def disable() -> None:
    """Give `cuda.tile.launch` back to cuTile (and torch.cuda its functions)."""
    _cuda_as_cpu.disable()          # first: it saved the functions the shim below installed
    if _state["real"] is not None:
        ct.launch, ct.tune.exhaustive_search = _state["real"]
        _state["real"] = None
    if _state["stream"] is not None:
        import torch
        for n, f in _state["stream"].items():
            setattr(torch.cuda, n, f)
        _state["stream"] = None
    if _state["is_cuda"]:
        import torch
        del torch.Tensor.is_cuda      # torch's own property (on TensorBase) answers again
        _state["is_cuda"] = False


def is_enabled() -> bool:
    return _state["real"] is not None and ct.launch is launch


def launch(stream, grid, kernel, kernel_args, /, *, programmatic_dependent_launch=False):
    """cuTile's launch signature, run by sim.launch; returns its LaunchReport. Inside a CUDA
    graph capture it is also recorded (sim.cuda_graph); a launch equal to an earlier one
    restores that one's result (sim.launch_memo)."""
    if not isinstance(kernel_args, (tuple, list)):
        raise TypeError(f"ct.launch: kernel_args must be a tuple, got {type(kernel_args).__name__}")
    with cuda_graph.recorded_launch(launch, (stream, grid, kernel, kernel_args)):
        return _launch(grid, kernel, kernel_args)


def _launch(grid, kernel, kernel_args):
    from .launch import launch as sim_launch
    args, write_back = [], []
    for i, a in enumerate(kernel_args):
        args.append(_as_sim(a, i, write_back))
    opts = dict(_state["options"])
    check = opts.pop("check", True)
    try:
        report = launch_memo.run(kernel, grid, args, opts,
                                 lambda: sim_launch(kernel, grid, args, check=False, **opts))
        stats["launches"] += 1
        stats["seconds"] += report.seconds
        profiler.note_launch(report.kernel, report.seconds)
        if check:
            _check(report)
        return report
    finally:
        for tensor, arr in write_back:
            _copy_back(tensor, arr)


def _check(report):
    """Double writes and races raise (the GPU's result would depend on timing). Output
    elements no block wrote are findings, not errors, here: host code often allocates an
    output with torch.zeros and lets the kernel write part of it (TileGym's MoE alignment
    counts), which is correct on a GPU; they join the summary at exit (sim.oob).
    SPAK_SIM_STRICT=1 raises for them too."""
    from . import oob
    from .errors import SimulationError
    soft = [f for f in report.findings if f.startswith("unwritten") and not oob.strict()]
    bad = [f for f in report.findings if f not in soft]
    for f in soft:
        oob.record(f"unwritten|{report.kernel}|{f.split('(first')[0]}",
                   f"kernel {report.kernel}: {f}")
    if bad:
        raise SimulationError(f"kernel {report.kernel}: checker found {len(bad)} problem(s):"
                              "\n  " + "\n  ".join(bad))


def exhaustive_search(search_space, stream, grid_fn, kernel, args_fn, hints_fn=None, *,
                      quiet=False, single_run_timeout_sec=None, flush_l2=True):
    """cuTile's autotuner, interpreted: a CPU cannot time a GPU kernel, so the first config
    that runs on the simulator is the answer (its time is NaN), the configs taken largest
    tiles first (_largest_tiles_first: fewer blocks and tile steps, so fewer simulated ops;
    TileGym's bmm: 64x64 tiles first on sm_90, 3.5x slower a flop than its matmul)."""
    from cuda.tile.tune import Measurement, TuningResult
    failures = []
    for cfg in _largest_tiles_first(search_space):
        k = kernel if isinstance(kernel, ct.kernel) or not callable(kernel) else kernel(cfg)
        try:
            launch(stream, grid_fn(cfg), k, args_fn(cfg))
        except Exception as e:  # noqa: BLE001 -- a config that fails is skipped, as cuTile does
            failures.append((cfg, type(e), str(e)))
            continue
        best = Measurement(config=cfg, mean_us=float("nan"), num_samples=0,
                           error_margin_us=float("nan"))
        return TuningResult(best=best, successes=(best,), failures=tuple(failures))
    cfg, exc, msg = failures[0] if failures else (None, ValueError, "empty search space")
    raise ValueError(f"No valid config found in search space (spak sim interpreter).\n"
                     f"Config: {cfg}\n{exc.__name__}: {msg}")


def _tile_volume(cfg) -> int:
    """The product of a config's TILE*/BLOCK* sizes (named fields: SimpleNamespace, dict,
    object); 0 for configs without names (tuples keep their order)."""
    fields = cfg if isinstance(cfg, dict) else getattr(cfg, "__dict__", None)
    if not isinstance(fields, dict):
        return 0
    sizes = [v for k, v in fields.items() if isinstance(k, str) and isinstance(v, int)
             and k.upper().startswith(("TILE", "BLOCK")) and v > 0]
    return int(np.prod(sizes)) if sizes else 0


def _largest_tiles_first(search_space):
    space = list(search_space)
    return sorted(space, key=lambda c: -_tile_volume(c))     # stable: ties keep their order


def _is_torch_tensor(a) -> bool:
    return type(a).__module__.startswith("torch") and hasattr(a, "device") and hasattr(a, "dtype")


def _as_sim(a, i, write_back):
    if isinstance(a, (list, tuple)) and a and all(_is_torch_tensor(x) for x in a):
        return [_as_sim(x, i, write_back) for x in a]      # a list of arrays argument
    if isinstance(a, np.ndarray) and a.flags.c_contiguous and dtypes.known_numpy(a.dtype):
        return SimArray(a)          # the launch memo reads its write record afterwards
    if not _is_torch_tensor(a):
        return a
    if a.device.type != "cpu":
        raise TypeError(f"ct.launch (spak sim interpreter): argument {i} is on {a.device}; "
                        "the simulator runs on CPU tensors (tensor.cpu()) or numpy arrays")
    dt = dtypes.as_ct_dtype(a.dtype)
    t = a.detach()
    if dt == ct.bfloat16:
        # .float() of a bf16 tensor is new memory holding bf16 values exactly: no second
        # copy, no rounding pass (both ran per launch: 4.7 s of a 31 s bf16 attention perf test)
        arr = SimArray(t.float().contiguous().numpy(), ct.bfloat16, name=f"arg{i}", rounded=True)
        write_back.append((a, arr))
        return arr
    if not t.is_contiguous():
        # a strided view (e.g. one half of a chunk): the simulator views the same memory
        return SimArray.strided(t.numpy() if dt not in dtypes.FP8 else _fp8_codes(t), dt,
                                name=f"arg{i}")
    if dt in dtypes.FP8:
        return SimArray(_fp8_codes(t), dt, name=f"arg{i}")   # codes, shared
    if dt not in dtypes.STORAGE:
        raise TypeError(f"ct.launch (spak sim interpreter): argument {i} has dtype {a.dtype}, "
                        "which the simulator does not hold")
    return SimArray(t.numpy())      # shared memory; named after the kernel's parameter


def _fp8_codes(t):
    import torch  # only reached with a torch tensor in hand
    return t.view(torch.uint8).numpy()


def _copy_back(tensor, arr):
    import torch  # only reached with torch tensors in hand
    with torch.no_grad():
        tensor.copy_(torch.from_numpy(np.ascontiguousarray(arr.data)).to(tensor.dtype))


def enabled_by_environment() -> bool:
    return os.environ.get("SPAK_SIM", "") not in ("", "0")
