"""NVIDIA's cuTile sample kernel (ci/peers/cutile_sample_fmha.py) as a ci/ab_fused.py peer.

    python ci/ab_fused.py --peer sample=ci/peers/ab_sample.py ...

Our own adapter, not NVIDIA code: ab_fused launches a peer's `fmha_fwd_kernel` with our
launch's grid and decorator hints (tiles, occupancy, num_ctas from the store), so the sample
runs at exactly our config in the same alternating, order-debiased timing; `peer_args` maps
our arguments onto the sample's signature. Only for what the sample supports: no mask,
Sq == Sk (its causal mask is top-left), every query row attending at least one key.
"""
import importlib.util
import math
from pathlib import Path

_spec = importlib.util.spec_from_file_location(
    "cutile_sample_fmha", Path(__file__).with_name("cutile_sample_fmha.py"))
_sample = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_sample)

fmha_fwd_kernel = _sample.fmha_kernel


def peer_args(ours: dict) -> tuple:
    """The sample's arguments from ours (by our parameter names)."""
    q, k = ours["Q"], ours["K"]
    if ours["HAS_MASK"] or q.shape[2] != k.shape[2] or ours["HEAD_DIM"] != q.shape[3]:
        raise ValueError("the sample peer runs only mask-free Sq == Sk with a power-of-two D")
    heads = q.shape[1]
    even_k = k.shape[2] % ours["TILE_N"] == 0
    return (q, k, ours["V"], ours["Out"], float(ours["scale"]), 0, ours["HEAD_DIM"], heads,
            ours["TILE_M"], ours["TILE_N"], heads // k.shape[1], ours["CAUSAL"], even_k)


def peer_grid(grid):
    """The sample's grid (query tiles, B * H, 1) from ours (query tiles, Hq, B)."""
    return (grid[0], grid[1] * grid[2], 1)
