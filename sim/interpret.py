"""Interpreter mode: cuTile's own `ct.launch(stream, grid, kernel, args)` runs the kernel on
the simulator, so existing host code runs on a CPU with CPU tensors or numpy arrays.

    import spak.sim
    spak.sim.enable()                  # or SPAK_SIM=1 in the environment, or
                                       # python -m spak.sim script.py [args]
    ct.launch(None, grid, kernel, (x_cpu, y_cpu, 128))

`stream` is ignored (the simulator runs launches one after another). Arrays: numpy
arrays, and torch CPU tensors (shared with the kernel, no copy; bfloat16 tensors are
copied in and written back after the launch). A CUDA tensor raises: pass CPU tensors.
Host code that calls `torch.cuda.current_stream()` needs a CUDA build of torch; pass
`None` as the stream instead. Breakpoints and `print`/`ct.printf` work inside kernels:
the kernel's own Python body runs, one block (or one lock-step group of blocks) at a time.
"""
from __future__ import annotations

import os

import numpy as np
import cuda.tile as ct

from . import dtypes
from .memory import SimArray

_state = {"real": None, "options": {}}


def enable(*, model="sm_90", check=True, mode="auto") -> None:
    """Make `cuda.tile.launch` run kernels on the simulator (sim.launch options)."""
    if _state["real"] is None:
        _state["real"] = ct.launch
    _state["options"] = {"model": model, "check": check, "mode": mode}
    ct.launch = launch


def disable() -> None:
    """Give `cuda.tile.launch` back to cuTile."""
    if _state["real"] is not None:
        ct.launch = _state["real"]
        _state["real"] = None


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
    if not a.is_contiguous():
        raise ValueError(f"ct.launch (spak sim interpreter): argument {i} is not contiguous; "
                         "a copy would not receive the kernel's stores")
    dt = dtypes.as_ct_dtype(a.dtype)
    t = a.detach()
    if dt == ct.bfloat16:
        arr = SimArray(t.float().numpy().copy(), ct.bfloat16, name=f"arg{i}")
        write_back.append((a, arr))
        return arr
    if dt in dtypes.FP8:
        import torch  # only reached with a torch tensor in hand
        return SimArray(t.view(torch.uint8).numpy(), dt, name=f"arg{i}")   # codes, shared
    if dt not in dtypes.STORAGE:
        raise TypeError(f"ct.launch (spak sim interpreter): argument {i} has dtype {a.dtype}, "
                        "which the simulator does not hold")
    return t.numpy()


def _copy_back(tensor, arr):
    import torch  # only reached with torch tensors in hand
    with torch.no_grad():
        tensor.copy_(torch.from_numpy(np.ascontiguousarray(arr.data)).to(tensor.dtype))


def enabled_by_environment() -> bool:
    return os.environ.get("SPAK_SIM", "") not in ("", "0")
