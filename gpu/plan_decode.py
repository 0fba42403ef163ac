"""Host-side launch plans for split-KV decode attention over a KV cache: framework-agnostic.

``plan_decode`` validates the arrays and returns the launches (gpu.plan.Launch) computing

    out[b, i, h] = softmax(q[b, i, h] . K_b^T * scale) V_b   over the first cache_seqlens[b]
                                                             keys of sequence b

with the kernels of gpu/kernels/decode.py: one split-KV launch and, when the keys are split
more than once, one combine launch. Like gpu.plan it never launches anything and never
imports torch: numpy arrays / sim.SimArray for the simulator, torch tensors on a GPU.

Layouts (FlashAttention's flash_attn_with_kvcache, vLLM):
  q             [B, Sq, Hq, D]               fp16 or bf16
  k_cache       [B, Sk_max, Hkv, D]          contiguous cache, or, with block_table,
                [num_pages, page_size, Hkv, D]
  v_cache       like k_cache with Dv
  cache_seqlens int32 [B]                    keys per sequence (device values; clamped to
                                             [0, capacity] by the kernel, not checked here)
  block_table   int32 [B, max_pages]         page ids per sequence (paged cache only)
  out           [B, Sq, Hq, Dv]

The split count comes from the shape and the SM count (``choose_num_splits``), or the
caller's ``num_splits``; the row tiling (GQA packing) from ``row_tiles``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from .kernels import decode as _decode
from .plan import (INPUT_DTYPES, MAX_HEAD_DIM, Launch, _check_bool, _check_contiguous,
                   _check_int, _check_scale, _dtype_name, _launch, _shape, _tile_width)

__all__ = ["plan_decode", "default_decode_tiles", "row_tiles", "choose_num_splits",
           "auto_splits", "TILE_KEYS", "MAX_SPLITS", "LAUNCH_NAMES"]

#: Config keys of a decode `tiles` dict: keys per step, and the most query rows
#: (query positions x packed heads) one block holds.
TILE_KEYS = ("TILE_N", "MAX_ROWS")
#: Fewer rows than this pad with zero query rows: the tensor cores' smallest M is 16.
MIN_ROWS = 16
MAX_SPLITS = 256
#: Split heuristic: aim for this many blocks per SM (one streams K/V while another
#: computes), and give every split at least this many key tiles (a split's fixed cost,
#: its partial state through memory and the combine, must stay small next to its keys).
WAVES = 2
MIN_TILES_PER_SPLIT = 2
LAUNCH_NAMES = ("decode", "decode.split", "decode.combine")
DEFAULT_SMS = 132            # H100 SXM; the API passes the device's own count


def default_decode_tiles(head_dim: int, arch: str = "sm_90") -> dict[str, int]:
    """{"TILE_N", "MAX_ROWS"} for a head dim: 128 keys per step up to D = 128 (a K and a V
    tile of 32 KB in flight per step: decode is bound by the memory system), 64 beyond.
    Untuned first guesses (the same for every arch) until the sweeper measures them."""
    d = _tile_width(_check_int("head_dim", head_dim, 1, MAX_HEAD_DIM))
    return {"TILE_N": 128 if d <= 128 else 64, "MAX_ROWS": 64}


def row_tiles(num_q_heads: int, num_kv_heads: int, seq_q: int, max_rows: int) -> tuple[int, int]:
    """(GT, SQ_T): query heads and query positions per block.

    GT is the largest power of two dividing the group size Hq/Hkv (tiles are powers of two;
    a group of 6 heads takes 3 blocks of 2), capped at max_rows; SQ_T covers Sq (a power of
    two), between MIN_ROWS / GT (tensor-core M) and max_rows / GT (registers)."""
    group = num_q_heads // num_kv_heads
    gt = min(group & -group, max_rows)
    sq_t = min(max(1 << max(seq_q - 1, 0).bit_length(), MIN_ROWS // gt), max(max_rows // gt, 1))
    return gt, sq_t


def choose_num_splits(blocks: int, key_tiles: int, num_sms: int) -> int:
    """Key splits for `blocks` (batch x head tiles x query tiles) blocks over `key_tiles`
    tiles of cache capacity: enough blocks for WAVES per SM, at least MIN_TILES_PER_SPLIT
    tiles each, at most MAX_SPLITS. From the capacity, not the lengths: those live on the
    device (reading them would cost a sync and break CUDA graph capture)."""
    if blocks <= 0 or key_tiles <= 0:
        return 1
    want = -(-WAVES * num_sms // blocks)
    return max(1, min(want, key_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS))


def auto_splits(B: int, Hq: int, Hkv: int, Sq: int, capacity: int, tile_n: int,
                max_rows: int, num_sms: int) -> int:
    """The split count plan_decode chooses when none is given (capacity: the cache's keys
    per sequence, Sk_max or max_pages x page_size)."""
    gt, sq_t = row_tiles(Hq, Hkv, Sq, max_rows)
    blocks = B * (Hq // gt) * -(-Sq // sq_t)
    return choose_num_splits(blocks, -(-capacity // tile_n), num_sms)


def plan_decode(q, k_cache, v_cache, cache_seqlens, out, *,
                block_table=None,
                causal: bool = False,
                scale: Optional[float] = None,
                num_splits: Optional[int] = None,
                tiles: Optional[dict] = None,
                num_sms: int = DEFAULT_SMS,
                alloc: Optional[Callable[[tuple, str], Any]] = None) -> list[Launch]:
    """Launches computing decode attention into ``out`` (layouts in the module docstring).

    causal: bottom-right (query i of a sequence of length L sees keys j <= i + L - Sq);
    only matters for Sq > 1. scale: default 1/sqrt(D), any finite number.
    num_splits: None (choose_num_splits) or an int in [1, MAX_SPLITS].
    tiles: {"TILE_N": 16..256, "MAX_ROWS": 16..256}, powers of two; default
    default_decode_tiles(D). With a paged cache TILE_N and the page size must divide one
    another, at most 8 pages per tile.
    alloc(shape, "float32") makes the split workspaces; may be omitted for numpy q.
    Returns [] when there is nothing to compute (B, Sq or Hq is 0).
    """
    B, Sq, Hq, D, Hkv, Dv, page, cap = _check_arrays(q, k_cache, v_cache, cache_seqlens, out,
                                                     block_table)
    causal = _check_bool("causal", causal)
    scale = _check_scale(scale, D)
    tn, max_rows = _check_tiles(tiles, D, page)
    num_sms = _check_int("num_sms", num_sms, 1, 1 << 16)
    if num_splits is not None:
        num_splits = _check_int("num_splits", num_splits, 1, MAX_SPLITS)
    if B * Sq * Hq == 0:
        return []
    gt, sq_t = row_tiles(Hq, Hkv, Sq, max_rows)
    tiles_qh = (Hq // gt) * -(-Sq // sq_t)
    splits = num_splits or auto_splits(B, Hq, Hkv, Sq, cap, tn, max_rows, num_sms)
    alloc = _resolve_alloc(alloc, q)
    bt = cache_seqlens if block_table is None else block_table   # never read when contiguous
    d_t, dv_t = _tile_width(D), _tile_width(Dv)
    if splits == 1:
        dummy = alloc((1, 1, 1, 1), "float32")                   # never read or written
        return [_launch(_decode.decode_split_kernel, (tiles_qh, 1, B),
                        (q, k_cache, v_cache, cache_seqlens, bt, out, dummy, dummy, dummy,
                         scale, d_t, dv_t, sq_t, gt, tn, page, False, causal), "decode")]
    acc = alloc((B * splits, Sq, Hq, Dv), "float32")
    mx = alloc((B, splits, Sq, Hq), "float32")
    lx = alloc((B, splits, Sq, Hq), "float32")
    return [_launch(_decode.decode_split_kernel, (tiles_qh, splits, B),
                    (q, k_cache, v_cache, cache_seqlens, bt, out, acc, mx, lx,
                     scale, d_t, dv_t, sq_t, gt, tn, page, True, causal), "decode.split"),
            _launch(_decode.decode_combine_kernel, (tiles_qh, B, 1),
                    (acc, mx, lx, out, dv_t, sq_t, gt),
                    "decode.combine")]


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------
def _check_arrays(q, k_cache, v_cache, cache_seqlens, out, block_table):
    """Sizes (B, Sq, Hq, D, Hkv, Dv, page size or 0, capacity in keys); raises
    ValueError/TypeError naming the argument."""
    shapes = {}
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
        shapes[name] = _shape(name, x)
        if len(shapes[name]) != 4:
            raise ValueError(f"{name} must be 4D, got shape {shapes[name]}")
    B, Sq, Hq, D = shapes["q"]
    NB, S, Hkv, Dk = shapes["k_cache"]
    NBv, Sv, Hv, Dv = shapes["v_cache"]
    if (NBv, Sv, Hv) != (NB, S, Hkv):
        raise ValueError(f"k_cache and v_cache must agree in all but the last dim, got "
                         f"{shapes['k_cache']} and {shapes['v_cache']}")
    if Dk != D:
        raise ValueError(f"q and k_cache must have the same head dim, got {D} and {Dk}")
    for name, d in (("q/k head dim", D), ("v head dim", Dv)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name} must be in [1, {MAX_HEAD_DIM}], got {d}")
    if Hkv == 0 or Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be a multiple of the cache's kv heads ({Hkv})")
    if shapes["out"] != (B, Sq, Hq, Dv):
        raise ValueError(f"out must have shape {(B, Sq, Hq, Dv)} [B, Sq, Hq, Dv], "
                         f"got {shapes['out']}")
    _check_int32_vector("cache_seqlens", cache_seqlens, (B,))
    if block_table is None:
        if NB != B:
            raise ValueError(f"k_cache batch ({NB}) must match q batch ({B}) for a "
                             f"contiguous cache [B, Sk_max, Hkv, D]")
        page, cap = 0, S
    else:
        bt = _shape("block_table", block_table)
        if len(bt) != 2 or bt[0] != B:
            raise ValueError(f"block_table must be 2D [B={B}, max_pages], got shape {bt}")
        _check_int32_vector("block_table", block_table, bt)
        page, cap = S, S * bt[1]
        if page < 16 or page & (page - 1):
            raise ValueError(f"page size (k_cache.shape[1]) must be a power of two >= 16 "
                             f"with block_table, got {page}")
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out)):
        _check_contiguous(name, x)
    names = {n: _dtype_name(x) for n, x in
             (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("out", out))}
    if names["q"] not in INPUT_DTYPES:
        raise TypeError(f"q dtype must be one of {INPUT_DTYPES}, got {names['q']}")
    for n in ("k_cache", "v_cache", "out"):
        if names[n] != names["q"]:
            raise TypeError(f"{n} dtype ({names[n]}) must match q dtype ({names['q']})")
    return B, Sq, Hq, D, Hkv, Dv, page, cap


def _check_int32_vector(name, x, shape):
    got = _shape(name, x)
    if got != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {got}")
    if _dtype_name(x) != "int32":
        raise TypeError(f"{name} dtype must be int32, got {_dtype_name(x)}")
    _check_contiguous(name, x)


def _check_tiles(tiles, head_dim, page) -> tuple[int, int]:
    t = default_decode_tiles(head_dim)
    if tiles is not None:
        if not isinstance(tiles, dict):
            raise TypeError(f"tiles must be a dict with keys {TILE_KEYS} or None, "
                            f"got {type(tiles).__name__}")
        unknown = set(tiles) - set(TILE_KEYS)
        if unknown:
            raise ValueError(f"tiles: unknown keys {sorted(map(str, unknown))}; "
                             f"accepted: {', '.join(TILE_KEYS)}")
        t.update({k: v for k, v in tiles.items() if v is not None})
    for key in TILE_KEYS:
        n = _check_int(f"tiles[{key!r}]", t[key], 16, 256)
        if n & (n - 1):
            raise ValueError(f"tiles[{key!r}] must be a power of two, got {n}")
    tn = int(t["TILE_N"])
    if page and tn > 8 * page:
        raise ValueError(f"tiles['TILE_N'] ({tn}) may span at most 8 pages of {page}")
    return tn, int(t["MAX_ROWS"])


def _resolve_alloc(alloc, q):
    if alloc is not None:
        if not callable(alloc):
            raise TypeError(f"alloc must be callable(shape, kind), got {alloc!r}")
        return alloc
    import numpy as np
    if type(q) is not np.ndarray and type(q).__name__ != "SimArray":
        raise ValueError("alloc(shape, kind) is required unless q is a numpy array "
                         f"(q is {type(q).__name__})")
    return lambda shape, kind: np.zeros(shape, dtype=np.float32)
