"""Argument checks shared by the PyTorch entry points (spak.fmha in spak/api.py,
spak.fmha_kvcache in spak/kvcache.py, spak.fmha_varlen in spak/varlen.py).

One home per check, so the three entry points word their errors alike (docs/errors.md
lists every message); each caller passes only what differs: argument names, the tile
keys it accepts, its own CPU hint.
"""
from __future__ import annotations

import math
import numbers

import torch

__all__ = ["DTYPES", "MAX_SCALE", "check_dtypes", "check_scale", "check_tiles", "check_devices"]

MAX_SCALE = 3.4028234663852886e38 / 1.4426950408889634 / 2   # = gpu.plan.MAX_SCALE
DTYPES = (torch.float16, torch.bfloat16)


def check_dtypes(q, named) -> None:
    """q fp16 or bf16, and each (name, tensor) of `named` in q's dtype."""
    if q.dtype not in DTYPES:
        raise TypeError(f"q dtype must be torch.float16 or torch.bfloat16, got {q.dtype}")
    for name, t in named:
        if t.dtype != q.dtype:
            raise TypeError(f"{name} dtype must match q dtype ({q.dtype}), got {t.dtype}")


def check_scale(scale):
    """None, or a finite real within what the kernels hold in float32: as a float."""
    if scale is None:
        return None
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number (float or int) or None, got "
                        f"{type(scale).__name__} {scale!r}")
    scale = float(scale)
    if not math.isfinite(scale):
        raise ValueError(f"scale must be finite (0 and negative are allowed), got {scale}")
    if abs(scale) > MAX_SCALE:
        raise ValueError(f"scale must be within +-{MAX_SCALE:.3g} (the kernels hold "
                         f"scale*log2(e) in float32), got {scale}")
    return scale


def check_tiles(tiles, keys, shown: str, choices=None) -> dict:
    """None (-> {}) or a dict of `keys` with int values, powers of two in [16, 256] except
    the keys of `choices` ({key: (allowed values, what they mean)}); `shown` is the dict
    the TypeError describes. Returns the dict with plain ints."""
    if tiles is None:
        return {}
    if not isinstance(tiles, dict):
        raise TypeError(f"tiles must be a dict {shown} or None, got {type(tiles).__name__}")
    unknown = set(tiles) - set(keys)
    if unknown:
        raise ValueError(f"tiles has unknown keys {sorted(map(str, unknown))}; accepted: "
                         f"{', '.join(keys)}")
    for key, val in tiles.items():
        if isinstance(val, bool) or not isinstance(val, numbers.Integral):
            raise TypeError(f"tiles[{key!r}] must be an int, got {val!r}")
        if choices and key in choices:
            allowed, meaning = choices[key]
            if val not in allowed:
                raise ValueError(f"tiles[{key!r}] must be one of {allowed} ({meaning}), "
                                 f"got {val}")
        elif not 16 <= val <= 256 or val & (val - 1):
            raise ValueError(f"tiles[{key!r}] must be a power of two in [16, 256], got {val}")
    return {k: int(v) for k, v in tiles.items()}


def simulated_gpu() -> bool:
    """True while interpreter mode presents a simulated GPU (spak.sim.cuda_as_cpu: "cuda"
    tensors live on the CPU and ct.launch runs on the simulator), so the public functions
    run there on CPU tensors, as a user's GPU program calls them. Never imports the sim."""
    import sys
    mod = sys.modules.get("spak.sim.cuda_as_cpu")
    return mod is not None and mod.is_enabled()


def check_devices(named, optional, require_cuda: bool, entry: str, cpu_hint: str) -> None:
    """One device for every tensor, and a CUDA one unless the caller allows otherwise.

    named: the (name, tensor) pairs always given, q, k, v first; optional: (name, value)
    pairs that may be absent (None, or an int for cache_seqlens). The messages name every
    argument, the "got" part only the tensors given."""
    names = [n for n, _ in named] + [n for n, _ in optional]
    given = list(named) + [(n, t) for n, t in optional if isinstance(t, torch.Tensor)]
    if len({str(t.device) for _, t in given}) > 1:
        raise ValueError(f"{', '.join(names[:-1])} and {names[-1]} must be on one device, "
                         f"got " + ", ".join(f"{n} {t.device}" for n, t in given))
    q = named[0][1]
    if require_cuda and q.device.type != "cuda" and not simulated_gpu():
        raise ValueError(f"{', '.join(n for n, _ in named[:3])} must be CUDA tensors ({entry} "
                         f"runs cuTile kernels on an NVIDIA GPU), got device {q.device}; for "
                         f"CPU use {cpu_hint}")
