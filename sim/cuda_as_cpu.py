"""Interpreter mode's `cuda_as_cpu` option: host code that names the GPU runs on a CPU torch.

Programs written for a GPU allocate with `device="cuda"` (TileGym's layer_norm_legacy:
`torch.empty((M,), device="cuda")`), move tensors with `.cuda()` / `.to("cuda")` and call
`torch.cuda.synchronize()`. A CPU build of torch refuses all three ("Torch not compiled with
CUDA enabled"), so such a program cannot run unmodified on the simulator. While this mode is
on, a torch function mode rewrites every CUDA device argument of a torch call to the CPU
(the mechanism torch.set_default_device uses), `.cuda()` returns the tensor itself and
`torch.cuda.synchronize()` does nothing (the simulator has finished every launch when
ct.launch returns). Nothing else about torch changes: `torch.cuda.is_available()` stays
False, and tensors report `device(type='cpu')`.

Opt-in (interpret.enable(cuda_as_cpu=True) or SPAK_SIM_CUDA_AS_CPU=1), because it changes
what a program's torch calls mean; on a torch with CUDA it is never switched on.
"""
from __future__ import annotations

_state = {"mode": None, "synchronize": None}


def _is_cuda_device(d) -> bool:
    import torch
    if isinstance(d, str):
        return d.split(":", 1)[0] == "cuda"
    return isinstance(d, torch.device) and d.type == "cuda"


def _to_cpu(d):
    import torch
    return torch.device("cpu") if _is_cuda_device(d) else d


def _mode_class():
    import torch
    from torch.overrides import TorchFunctionMode

    class CudaAsCpu(TorchFunctionMode):
        """Rewrites CUDA device arguments of torch calls to the CPU."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is torch.Tensor.cuda:
                return args[0]          # already where the simulator reads it
            if "device" in kwargs:
                kwargs["device"] = _to_cpu(kwargs["device"])
            if func is torch.Tensor.to:
                args = tuple(_to_cpu(a) for a in args)
            return func(*args, **kwargs)

    return CudaAsCpu


def enable() -> bool:
    """Switch the mode on (idempotent); False where torch is missing or has CUDA."""
    if _state["mode"] is not None:
        return True
    try:
        import torch
    except ImportError:
        return False
    if torch.cuda.is_available():
        return False            # real CUDA tensors exist: never pretend otherwise
    mode = _mode_class()()
    mode.__enter__()
    _state["mode"] = mode
    _state["synchronize"] = torch.cuda.synchronize
    torch.cuda.synchronize = lambda device=None: None
    return True


def disable() -> None:
    if _state["mode"] is None:
        return
    import torch
    _state["mode"].__exit__(None, None, None)
    torch.cuda.synchronize = _state["synchronize"]
    _state["mode"] = _state["synchronize"] = None


def is_enabled() -> bool:
    return _state["mode"] is not None
