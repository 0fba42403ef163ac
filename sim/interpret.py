"""Interpreter mode: cuTile's own `ct.launch(stream, grid, kernel, args)` runs the kernel on
the simulator, so existing host code runs on a CPU with CPU tensors or numpy arrays.

    import spak.sim
    spak.sim.enable()                  # or SPAK_SIM=1 in the environment, or
                                       # python -m spak.sim script.py [args]
    ct.launch(None, grid, kernel, (x_cpu, y_cpu, 128))

`stream` is ignored (the simulator runs launches one after another). Arrays: numpy
arrays, and torch CPU tensors (shared with the kernel, no copy; bfloat16 tensors are
copied in and written back after the launch). A CUDA tensor raises: pass CPU tensors.
On a torch without CUDA, `torch.cuda.current_stream()` returns None while enabled, so
host code written for the GPU (NVIDIA's samples) runs when it has no `is_cuda` checks. Breakpoints and `print`/`ct.printf` work inside kernels:
the kernel's own Python body runs, one block (or one lock-step group of blocks) at a time.
"""
from __future__ import annotations

import os

import numpy as np
import cuda.tile as ct

from . import dtypes
from .memory import SimArray

_state = {"real": None, "options": {}, "stream": None}


def enable(*, model="sm_90", check=True, mode="auto", cpu_stream=True) -> None:
    """Make `cuda.tile.launch` run kernels on the simulator (sim.launch options).

    cpu_stream: on a torch without CUDA, `torch.cuda.current_stream()` (which NVIDIA's
    samples pass to ct.launch) returns None instead of raising, until disable()."""
    if _state["real"] is None:
        _state["real"] = ct.launch
    _state["options"] = {"model": model, "check": check, "mode": mode}
    ct.launch = launch
    if cpu_stream and _state["stream"] is None:
        _shim_torch_stream()


def _shim_torch_stream():
    try:
        import torch  # lazily: sim/ never needs torch, host code that uses it does
    except ImportError:
        return
    if not torch.cuda.is_available():
        _state["stream"] = torch.cuda.current_stream
        torch.cuda.current_stream = lambda device=None: None


def disable() -> None:
    """Give `cuda.tile.launch` back to cuTile (and torch its current_stream)."""
    if _state["real"] is not None:
        ct.launch = _state["real"]
        _state["real"] = None
    if _state["stream"] is not None:
        import torch
        torch.cuda.current_stream = _state["stream"]
        _state["stream"] = None


def is_enabled() -> bool:
    return _state["real"] is not None and ct.launch is launch


def launch(stream, grid, kernel, kernel_args, /, *, programmatic_dependent_launch=False):
    """cuTile's launch signature, run by sim.launch; returns its LaunchReport."""
    from .launch import launch as sim_launch
    if not isinstance(kernel_args, (tuple, list)):
        raise TypeError(f"ct.launch: kernel_args must be a tuple, got {type(kernel_args).__name__}")
    args, write_back = [], []
    for i, a in enumerate(kernel_args):
        args.append(_as_sim(a, i, write_back))
    try:
        return sim_launch(kernel, grid, args, **_state["options"])
    finally:
        for tensor, arr in write_back:
            _copy_back(tensor, arr)


def _is_torch_tensor(a) -> bool:
    return type(a).__module__.startswith("torch") and hasattr(a, "device") and hasattr(a, "dtype")


def _as_sim(a, i, write_back):
    if not _is_torch_tensor(a):
        return a
    if a.device.type != "cpu":
        raise TypeError(f"ct.launch (spak sim interpreter): argument {i} is on {a.device}; "
                        "the simulator runs on CPU tensors (tensor.cpu()) or numpy arrays")
    dt = dtypes.as_ct_dtype(a.dtype)
    t = a.detach()
    if dt == ct.bfloat16:
        arr = SimArray(t.float().contiguous().numpy().copy(), ct.bfloat16, name=f"arg{i}")
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
    return t.numpy()


def _fp8_codes(t):
    import torch  # only reached with a torch tensor in hand
    return t.view(torch.uint8).numpy()


def _copy_back(tensor, arr):
    import torch  # only reached with torch tensors in hand
    with torch.no_grad():
        tensor.copy_(torch.from_numpy(np.ascontiguousarray(arr.data)).to(tensor.dtype))


def enabled_by_environment() -> bool:
    return os.environ.get("SPAK_SIM", "") not in ("", "0")
