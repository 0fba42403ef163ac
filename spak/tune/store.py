"""The tuned-config store: the best tile config per GPU and shape class.

`spak sweep` (issue 4) writes it; `spak.fmha` reads it through `lookup`. The store is one
versioned JSON file, `spak/data/tuned_configs.json` by default (`SPAK_TUNED_CONFIGS`
overrides the path):

    {"version": 1,
     "configs": [
       {"gpu": "NVIDIA H100 80GB HBM3", "kernel": "fused", "dtype": "fp16",
        "head_dim": 64, "causal": false, "seq_bucket": 4096,
        "tiles": {"TILE_M": 64, "TILE_N": 64, "occupancy": 2},
        "tflops": 431.0, "date": "2026-11-22", "source": "results/sweep-....jsonl"}]}

Only gpu/kernel/dtype/head_dim/causal/seq_bucket/tiles are needed for a lookup; the other
fields record what chose the entry (spak/store.py writes them). `tiles` always holds TILE_M
and TILE_N, and the kernel hints `occupancy` / `num_ctas` when the sweep chose them (absent:
cuTile's auto; gpu.variants.apply_hints applies them). `seq_bucket` is `seq_bucket(Sk)`: the
power of two at or above the key length (at least 128). A lookup takes the entry of the same
bucket, else the one of the nearest bucket (in log2) for the same (gpu, kernel, dtype,
head_dim, causal), the larger bucket on a tie, else None (the caller then uses
gpu.plan.default_tiles). The GPU name must match exactly.

Numpy/torch free; reading the file is cached per (path, mtime).
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Optional

__all__ = ["FORMAT_VERSION", "DEFAULT_PATH", "TunedStoreError", "store_path", "seq_bucket",
           "normalize_dtype", "load_store", "lookup", "make_entry", "upsert", "write_store"]

FORMAT_VERSION = 1
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "tuned_configs.json"
_KEYS = ("gpu", "kernel", "dtype", "head_dim", "causal", "seq_bucket")
_MIN_BUCKET = 128


class TunedStoreError(ValueError):
    """The tuned-config file is unreadable, truncated, of another version or malformed."""


def store_path(path=None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get("SPAK_TUNED_CONFIGS")
    return Path(env) if env else DEFAULT_PATH


def seq_bucket(seq_len: int) -> int:
    """The power of two >= seq_len, at least 128: 1000 -> 1024, 4096 -> 4096, 1 -> 128."""
    n = int(seq_len)
    if n < 0:
        raise ValueError(f"seq_len must be >= 0, got {seq_len}")
    return max(_MIN_BUCKET, 1 << max(0, n - 1).bit_length())


def normalize_dtype(dtype) -> str:
    """'fp16' / 'bf16' from 'fp16', 'float16', torch.float16, numpy float16, ..."""
    name = getattr(dtype, "name", None)
    s = (name if isinstance(name, str) else str(dtype)).rsplit(".", 1)[-1].lower()
    table = {"fp16": "fp16", "float16": "fp16", "half": "fp16",
             "bf16": "bf16", "bfloat16": "bf16"}
    if s not in table:
        raise ValueError(f"dtype must be fp16 or bf16 (or float16/bfloat16), got {dtype!r}")
    return table[s]


def _validate(doc, path) -> dict:
    if not isinstance(doc, dict):
        raise TunedStoreError(f"{path}: top level must be a JSON object, got {type(doc).__name__}")
    version = doc.get("version")
    if version != FORMAT_VERSION:
        raise TunedStoreError(f"{path}: version must be {FORMAT_VERSION}, got {version!r} "
                              f"(rewrite it with `spak sweep` of this SPAK version)")
    configs = doc.get("configs")
    if not isinstance(configs, list):
        raise TunedStoreError(f"{path}: 'configs' must be a list")
    for i, e in enumerate(configs):
        if not isinstance(e, dict):
            raise TunedStoreError(f"{path}: configs[{i}] must be an object")
        missing = [k for k in (*_KEYS, "tiles") if k not in e]
        if missing:
            raise TunedStoreError(f"{path}: configs[{i}] lacks {missing}")
        bad = _entry_problem(e)
        if bad:
            raise TunedStoreError(f"{path}: configs[{i}].{bad}")
    return doc


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _entry_problem(e: dict) -> Optional[str]:
    """What is wrong with one entry's fields ("field: why"), or None. Every field a lookup,
    spak.fmha or `spak store show` reads is checked, so a corrupt store is reported (and
    ignored by lookup) instead of crashing them later."""
    for k in ("gpu", "kernel"):
        if not isinstance(e[k], str):
            return f"{k} must be a string, got {e[k]!r}"
    if e["dtype"] not in ("fp16", "bf16"):
        return f"dtype must be 'fp16' or 'bf16', got {e['dtype']!r}"
    if not _is_int(e["head_dim"]) or not 1 <= e["head_dim"] <= 256:
        return f"head_dim must be an int in [1, 256], got {e['head_dim']!r}"
    if not isinstance(e["causal"], bool):
        return f"causal must be true or false, got {e['causal']!r}"
    if not _is_int(e["seq_bucket"]) or e["seq_bucket"] < 1:
        return f"seq_bucket must be a positive int, got {e['seq_bucket']!r}"
    t = e["tiles"]
    if not isinstance(t, dict):
        return f"tiles must be an object, got {t!r}"
    for k in ("TILE_M", "TILE_N"):
        n = t.get(k)
        if not _is_int(n) or not 16 <= n <= 256 or n & (n - 1):
            return f"tiles.{k} must be a power of two in [16, 256], got {n!r}"
    for k, v in t.items():
        if v is not None and (not _is_int(v) or v < 0):
            return f"tiles.{k} must be a non-negative int or null, got {v!r}"
    for k in ("tflops", "default_tflops", "speedup_vs_default"):
        if e.get(k) is not None and not _is_num(e[k]):
            return f"{k} must be a number or null, got {e[k]!r}"
    for k in ("date", "source", "config_id", "commit", "sweep_id"):
        if e.get(k) is not None and not isinstance(e[k], str):
            return f"{k} must be a string or null, got {e[k]!r}"
    return None


_cache: dict = {}


def load_store(path=None) -> dict:
    """The store as a dict; a missing file is an empty store. Raises TunedStoreError."""
    p = store_path(path)
    try:
        mtime = p.stat().st_mtime_ns
    except FileNotFoundError:
        return {"version": FORMAT_VERSION, "configs": []}
    key = (str(p), mtime)
    if key not in _cache:
        try:
            doc = json.loads(p.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
            raise TunedStoreError(f"{p}: cannot read the tuned-config store "
                                  f"({type(e).__name__}: {e}); fix or delete it") from None
        _cache.clear()
        _cache[key] = _validate(doc, p)
    return _cache[key]


def lookup(gpu_name: str, kernel: str, dtype, head_dim: int, causal: bool, seq_len: int,
           *, path=None, strict: bool = False) -> Optional[dict]:
    """The tuned tiles {"TILE_M", "TILE_N", ...} for a problem, or None. Entries for
    ``gpu_name`` win; without any, those of a GPU of the same arch are used.

    A corrupt store warns and returns None (strict=False, what spak.fmha uses: a bad
    store must not stop attention from running) or raises TunedStoreError (strict=True).
    """
    try:
        store = load_store(path)
    except TunedStoreError as e:
        if strict:
            raise
        warnings.warn(f"ignoring the tuned-config store: {e}", RuntimeWarning, stacklevel=2)
        return None
    want = (str(kernel), normalize_dtype(dtype), int(head_dim), bool(causal))
    entries = [e for e in store["configs"]
               if (e["kernel"], e["dtype"], int(e["head_dim"]), bool(e["causal"])) == want]
    mine = [e for e in entries if e["gpu"] == str(gpu_name)]
    # None tuned on this GPU: take a sibling's (same arch per spak.device.archs, e.g. an H200's
    # configs on an H100: the same SM design, and this work is compute-bound)
    best = _nearest(mine or [e for e in entries if _siblings(e["gpu"], str(gpu_name))],
                    seq_bucket(seq_len))
    return dict(best["tiles"]) if best is not None else None


def _nearest(entries, bucket):
    """The entry whose sequence bucket is nearest (log scale); ties go to the larger."""
    best, best_dist = None, None
    for e in entries:
        dist = abs(int(e["seq_bucket"]).bit_length() - bucket.bit_length())
        if best_dist is None or dist < best_dist or (
                dist == best_dist and int(e["seq_bucket"]) > int(best["seq_bucket"])):
            best, best_dist = e, dist
    return best


def _siblings(a: str, b: str) -> bool:
    """Two GPU names SPAK knows (spak.device.archs) with the same arch."""
    from spak.device import archs
    pa, pb = archs.lookup(a), archs.lookup(b)
    return pa is not None and pb is not None and pa.arch == pb.arch


def make_entry(gpu_name: str, kernel: str, dtype, head_dim: int, causal: bool, seq_len: int,
               tiles: dict, **info) -> dict:
    """A store entry; ``info`` (tflops, date, source, commit, ...) is kept as given."""
    return {"gpu": str(gpu_name), "kernel": str(kernel), "dtype": normalize_dtype(dtype),
            "head_dim": int(head_dim), "causal": bool(causal), "seq_bucket": seq_bucket(seq_len),
            "tiles": {k: int(v) for k, v in tiles.items()}, **info}


def upsert(store: dict, entry: dict) -> dict:
    """Replace the entry with the same key (gpu..seq_bucket) or append it; returns store."""
    key = tuple(entry[k] for k in _KEYS)
    store["configs"] = [e for e in store.get("configs", []) if tuple(e[k] for k in _KEYS) != key]
    store["configs"].append(entry)
    store["version"] = FORMAT_VERSION
    return store


def write_store(store: dict, path=None) -> Path:
    """Atomically write the store (temp file + fsync + rename): never a half-written file."""
    p = store_path(path)
    _validate(store, p)
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_name(p.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(store, f, indent=1, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, p)
    return p
