"""Error measures of GPU outputs (torch tensors), computed in float64 on the tensors'
device: the torch side of spak.core.metrics. torch is imported inside the functions.
"""
from __future__ import annotations

import math

__all__ = ["rel_l2", "max_abs", "nonfinite", "output_errors"]


def rel_l2(a, b) -> float:
    """||a - b|| / ||b|| in float64; 0 when both are zero, inf when only b is."""
    import torch
    a, b = a.double(), b.double()
    den = float(torch.linalg.vector_norm(b))
    num = float(torch.linalg.vector_norm(a - b))
    if den == 0.0:
        return 0.0 if num == 0.0 else math.inf
    return num / den


def max_abs(out, ref) -> float:
    """Largest |out - ref| (NaN when out holds a NaN); 0 for empty tensors."""
    return float((out.double() - ref).abs().max()) if out.numel() else 0.0


def nonfinite(t) -> int:
    """How many elements are NaN or +-Inf."""
    import torch
    return int((~torch.isfinite(t)).sum())


def output_errors(out, ref, peer=None) -> dict:
    """One output against its float64 reference (and a peer's output, when given):
    nonfinite, rel_l2, max_abs, rel_l2_vs_sdpa (None without a peer)."""
    return {"nonfinite": nonfinite(out), "rel_l2": rel_l2(out, ref),
            "max_abs": max_abs(out, ref),
            "rel_l2_vs_sdpa": None if peer is None else rel_l2(out, peer)}
