"""Interpreter mode's `cuda_as_cpu` option: host code that names the GPU runs on a CPU torch.

Programs written for a GPU allocate with `device="cuda"` (TileGym's layer_norm_legacy:
`torch.empty((M,), device="cuda")`), move tensors with `.cuda()` / `.to("cuda")` and ask
`torch.cuda` about the device. A CPU build of torch refuses all of it ("Torch not compiled
with CUDA enabled"). While this mode is on:

- a torch function mode rewrites every CUDA device argument of a torch call to the CPU (the
  mechanism torch.set_default_device uses); tensors report `device(type='cpu')`;
- `torch.cuda` presents one simulated GPU (sim/host_gpu.py: queries, seeds, streams,
  events, memory statistics);
- copies between host and "device" stay copies, as on a GPU: a tensor made on "cuda" (or
  from one) is marked, and `.cuda()` / `.to("cuda")` of an unmarked tensor, or `.cpu()` /
  `.to("cpu")` of a marked one, returns a new tensor (autograd sees a copy, not the same
  tensor: a program's "view created in no_grad mode ... modified inplace" does not appear
  where the GPU has none); a move to where the tensor already is returns it, as torch does;
- float32 matmuls of "cuda" tensors under `torch.backends.cuda.matmul.allow_tf32 = True`
  round their inputs to TF32 first, as cuBLAS does on the GPU (a reference computed that
  way is what the program's tolerances were set against); fp16/bf16 matmuls of "cuda"
  tensors sum in float32 and round once, as cuBLAS does (CPU torch's half GEMM: the same
  sums, 100x slower);
- `scaled_dot_product_attention` runs with the math backend allowed: a reference computed
  under `sdpa_kernel(CUDNN_ATTENTION or FLASH_ATTENTION)` (GPU-only backends) gets the
  attention the author meant instead of "No viable backend".

Opt-in (interpret.enable(cuda_as_cpu=True), SPAK_SIM_CUDA_AS_CPU=1, and on in the pytest
plugin and `python -m spak.sim`), because it changes what a program's torch calls mean; on
a torch with CUDA it is never switched on.
"""
from __future__ import annotations

from . import host_gpu

_state = {"mode": None}
_MARK = "_spak_sim_on_gpu"


def _is_cuda_device(d) -> bool:
    import torch
    if isinstance(d, str):
        return d.split(":", 1)[0] == "cuda"
    return isinstance(d, torch.device) and d.type == "cuda"


def _is_cpu_device(d) -> bool:
    import torch
    if isinstance(d, str):
        return d.split(":", 1)[0] == "cpu"
    return isinstance(d, torch.device) and d.type == "cpu"


def _to_cpu(d):
    import torch
    return torch.device("cpu") if _is_cuda_device(d) else d


def _marked(x) -> bool:
    if isinstance(x, (list, tuple)):
        return any(_marked(y) for y in x[:8])
    return getattr(x, _MARK, False)


def _mark(out, on):
    import torch
    if isinstance(out, torch.Tensor):
        try:
            setattr(out, _MARK, on)
        except (AttributeError, RuntimeError):
            pass                            # a tensor subclass without __dict__: unmarked
    elif isinstance(out, (list, tuple)):
        for o in out:
            _mark(o, on)
    return out


def _target(func, args, kwargs):
    """The device a .to()/.cuda()/.cpu() call moves to: "cuda", "cpu" or None (no move)."""
    import torch
    if func is torch.Tensor.cuda:
        return "cuda"
    if func is torch.Tensor.cpu:
        return "cpu"
    if func is not torch.Tensor.to:
        return None
    cands = list(args[1:2]) + [kwargs.get("device")]
    for d in cands:
        if _is_cuda_device(d):
            return "cuda"
        if _is_cpu_device(d):
            return "cpu"
    return None


def _move(func, args, kwargs, target):
    """A host<->device move: a copy when the tensor changes side, itself when it does not."""
    import torch
    t = args[0]
    crossing = _marked(t) != (target == "cuda")
    if func is torch.Tensor.to:
        args = tuple(_to_cpu(a) for a in args)
        if "device" in kwargs:
            kwargs["device"] = _to_cpu(kwargs["device"])
        if crossing:
            kwargs["copy"] = True
        out = func(*args, **kwargs)
    else:
        out = t.to("cpu", copy=True) if crossing else t
    return _mark(out, target == "cuda") if crossing else out


def _sdpa(func, args, kwargs):
    import torch
    was = torch.backends.cuda.math_sdp_enabled()
    torch._C._set_sdp_use_math(True)
    try:
        return func(*args, **kwargs)
    finally:
        torch._C._set_sdp_use_math(was)


def _tf32(t):
    """float32 rounded to TF32 (10-bit mantissa, round to nearest, ties away: cvt.rna.tf32),
    what cuBLAS feeds the tensor cores when torch.backends.cuda.matmul.allow_tf32 is set."""
    import torch
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
        return t
    bits = t.detach().contiguous().view(torch.int32)
    finite = torch.isfinite(t.detach())
    r = ((bits + 0x1000) & ~0x1FFF).view(torch.float32)
    out = torch.where(finite, r, t.detach()).view(t.shape)
    return out if not t.requires_grad else t + (out - t).detach()


def _cublas_matmul(func, args, kwargs):
    """A matmul of "cuda" tensors as cuBLAS computes it on the GPU. float32 under
    torch.backends.cuda.matmul.allow_tf32: inputs rounded to TF32 (accumulation float32).
    fp16/bf16: products summed in float32 and rounded once to the inputs' dtype (cuBLAS's
    CUBLAS_COMPUTE_32F, torch's default there). CPU torch's own half GEMM also sums in float,
    but 100x slower (0.33 against 35 GFLOP/s on one thread of the project's CPU, 2026-11-28):
    a GPU program's fp16 reference at benchmark sizes took minutes."""
    import torch
    if torch.backends.cuda.matmul.allow_tf32:
        return func(*(_tf32(a) for a in args), **kwargs)
    ts = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]
    dt = ts[0].dtype if ts else None
    if ("out" in kwargs or dt not in (torch.float16, torch.bfloat16)
            or any(t.dtype != dt for t in ts)):
        return func(*args, **kwargs)
    up = lambda a: a.float() if isinstance(a, torch.Tensor) else a      # noqa: E731
    return func(*map(up, args), **{k: up(v) for k, v in kwargs.items()}).to(dt)


def _matmul_funcs():
    import torch
    return {torch.matmul, torch.mm, torch.bmm, torch.Tensor.matmul, torch.Tensor.mm,
            torch.Tensor.bmm, torch.Tensor.__matmul__, torch.nn.functional.linear}


def _mode_class():
    import torch
    import torch.nn.functional as F
    from torch.overrides import TorchFunctionMode
    sdpa = F.scaled_dot_product_attention
    matmuls = _matmul_funcs()

    class CudaAsCpu(TorchFunctionMode):
        """Rewrites CUDA device arguments of torch calls to the CPU (see the module doc)."""

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            target = _target(func, args, kwargs)
            if target is not None:
                return _move(func, args, kwargs, target)
            on_gpu = False
            if "device" in kwargs:
                on_gpu = _is_cuda_device(kwargs["device"])
                kwargs["device"] = _to_cpu(kwargs["device"])
            if func is sdpa:
                out = _sdpa(func, args, kwargs)
            elif func in matmuls and _marked(args):
                out = _cublas_matmul(func, args, kwargs)
            else:
                out = func(*args, **kwargs)
            if on_gpu or _marked(args):
                _mark(out, True)
            return out

    return CudaAsCpu


def enable(model="sm_90") -> bool:
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
    host_gpu.enable(model)
    return True


def disable() -> None:
    if _state["mode"] is None:
        return
    host_gpu.disable()
    _state["mode"].__exit__(None, None, None)
    _state["mode"] = None


def is_enabled() -> bool:
    return _state["mode"] is not None
