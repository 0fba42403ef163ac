"""The tuned-config store: the best tile config per GPU and shape class.

`spak sweep --update-store` and `spak store update` write it (spak.tune.choose);
`spak.fmha` reads it through `lookup`. The store is one versioned JSON file,
`spak/data/tuned_configs.json` by default (`SPAK_TUNED_CONFIGS` overrides the path):

    {"version": 2,
     "configs": [
       {"family": "fmha_fwd", "gpu": "NVIDIA H100 80GB HBM3", "kernel": "fused",
        "dtype": "fp16", "head_dim": 64, "causal": false, "seq_bucket": 4096,
        "tiles": {"TILE_M": 64, "TILE_N": 64, "occupancy": 2},
        "tflops": 431.0, "date": "2026-11-22", "source": "results/sweep-....jsonl"}]}

An entry is filed under (family, gpu, kernel) and the family's ``store_fields`` (its
``store_key`` of a problem); for the FMHA forward dtype, head_dim, causal and seq_bucket.
Only those and tiles are needed for a lookup; the other fields record what chose the
entry (spak.tune.choose writes them). Version 2 added "family"; version-1 files (no
family: every entry is the FMHA forward's) are still read, as version 2.

For the FMHA forward, `tiles` always holds TILE_M and TILE_N, and the kernel hints `occupancy` / `num_ctas` when the sweep chose them (absent:
cuTile's auto; gpu.variants.apply_hints applies them). `seq_bucket` is `seq_bucket(Sk)`: the
power of two at or above the key length (at least 128). A lookup takes the entry of the same
bucket, else the one of the nearest bucket (in log2) for the same (gpu, kernel, dtype,
head_dim, causal), the larger bucket on a tie, else None (the caller then uses
gpu.plan.default_tiles); for any family, key fields named "..._bucket" match the nearest
this way and the others exactly. The GPU name must match exactly (or, without any entry
for it, a GPU of the same arch).

Small grids (optional, version 2 files stay valid): an entry may also carry "max_rows" (a
positive int): it then serves only problems of at most that many query rows (B * Hq * Sq,
what spak.fmha passes as ``rows``), beside the general entry of the same key, and wins
over it at the same bucket distance. Such an entry's `entry_key` ends in ("max_rows", n),
so `upsert` of a general entry leaves it alone, and a reader without this rule (which
takes the first of equal candidates; files are sorted by entry_key) still finds the
general entry first. Why: a grid of fewer blocks than one wave wants other tiles than the
bucket's big shapes (H100, issue 17: 2x8x512x64 64x128/o2 +13% over the 32x32x512x64 pick).

Numpy/torch free; reading the file is cached per (path, mtime).
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Optional

from spak.core.buckets import seq_bucket

__all__ = ["FORMAT_VERSION", "READ_VERSIONS", "DEFAULT_FAMILY", "V1_FIELDS", "DEFAULT_PATH",
           "TunedStoreError", "store_path", "seq_bucket", "normalize_dtype", "entry_family",
           "key_fields", "entry_key", "load_store", "lookup", "lookup_key", "make_entry",
           "upsert", "write_store"]

FORMAT_VERSION = 2
#: Versions `load_store` reads (a version-1 file is read as version 2: no entry has a family).
READ_VERSIONS = (1, 2)
#: The family of an entry without "family" (every entry of a version-1 file).
DEFAULT_FAMILY = "fmha_fwd"
#: The key fields of a version-1 entry: the FMHA forward's ``store_fields``, which the
#: family must keep (tests/test_store.py checks that they agree).
V1_FIELDS = ("dtype", "head_dim", "causal", "seq_bucket")
DEFAULT_PATH = Path(__file__).resolve().parents[1] / "data" / "tuned_configs.json"
_INFO_STR = ("date", "source", "config_id", "commit", "sweep_id")
_INFO_NUM = ("tflops", "default_tflops", "speedup_vs_default", "gpus", "tflops_spread")


class TunedStoreError(ValueError):
    """The tuned-config file is unreadable, truncated, of another version or malformed."""


def store_path(path=None) -> Path:
    if path is not None:
        return Path(path)
    env = os.environ.get("SPAK_TUNED_CONFIGS")
    return Path(env) if env else DEFAULT_PATH


def normalize_dtype(dtype) -> str:
    """'fp16' / 'bf16' from 'fp16', 'float16', torch.float16, numpy float16, ..."""
    name = getattr(dtype, "name", None)
    s = (name if isinstance(name, str) else str(dtype)).rsplit(".", 1)[-1].lower()
    table = {"fp16": "fp16", "float16": "fp16", "half": "fp16",
             "bf16": "bf16", "bfloat16": "bf16"}
    if s not in table:
        raise ValueError(f"dtype must be fp16 or bf16 (or float16/bfloat16), got {dtype!r}")
    return table[s]


# ------------------------------------------------------------------ families and keys

def entry_family(e: dict) -> str:
    return e.get("family", DEFAULT_FAMILY)


def key_fields(family: str) -> Optional[tuple]:
    """The fields a family's entries are filed under (besides family, gpu and kernel): its
    ``store_fields``; None for a family this SPAK does not know (its entries are kept and
    never match a lookup)."""
    if family == DEFAULT_FAMILY:
        return V1_FIELDS                 # without importing the family (numpy-free)
    from spak import families
    try:
        return tuple(families.get(family).store_fields)
    except ValueError:
        return None


def entry_key(e: dict) -> tuple:
    """(family, gpu, kernel, key field values...): what `upsert` replaces an entry by."""
    fam = entry_family(e)
    fields = key_fields(fam) or tuple(sorted(k for k in e if k not in
                                             ("family", "gpu", "kernel", "tiles",
                                              *_INFO_STR, *_INFO_NUM, "cases",
                                              "gpus_disagree")))
    small = (("max_rows", e["max_rows"]),) if e.get("max_rows") is not None else ()
    return (fam, e["gpu"], e["kernel"], *(e.get(f) for f in fields), *small)


# ------------------------------------------------------------------ validation

def _validate(doc, path) -> dict:
    if not isinstance(doc, dict):
        raise TunedStoreError(f"{path}: top level must be a JSON object, got {type(doc).__name__}")
    version = doc.get("version")
    if isinstance(version, bool) or version not in READ_VERSIONS:
        raise TunedStoreError(f"{path}: version must be {FORMAT_VERSION} (or "
                              f"{', '.join(map(str, READ_VERSIONS[:-1]))}), got {version!r} "
                              f"(rewrite it with `spak sweep` of this SPAK version)")
    configs = doc.get("configs")
    if not isinstance(configs, list):
        raise TunedStoreError(f"{path}: 'configs' must be a list")
    for i, e in enumerate(configs):
        if not isinstance(e, dict):
            raise TunedStoreError(f"{path}: configs[{i}] must be an object")
        bad = _family_problem(e, version)
        if bad:
            raise TunedStoreError(f"{path}: configs[{i}].{bad}")
        missing = [k for k in ("gpu", "kernel", *(key_fields(entry_family(e)) or ()), "tiles")
                   if k not in e]
        if missing:
            raise TunedStoreError(f"{path}: configs[{i}] lacks {missing}")
        bad = _entry_problem(e)
        if bad:
            raise TunedStoreError(f"{path}: configs[{i}].{bad}")
    return doc


def _family_problem(e: dict, version) -> Optional[str]:
    if "family" not in e:
        return None
    if version == 1:
        return "family: a version-1 store has no families (its entries are fmha_fwd's)"
    if not isinstance(e["family"], str) or not e["family"]:
        return f"family must be a kernel family's name, got {e['family']!r}"
    return None


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


#: Checks of the key fields the families use: field -> (ok(value), what it must be).
_FIELD_CHECKS = {
    "dtype": (lambda v: v in ("fp16", "bf16"), "'fp16' or 'bf16'"),
    "head_dim": (lambda v: _is_int(v) and 1 <= v <= 256, "an int in [1, 256]"),
    "causal": (lambda v: isinstance(v, bool), "true or false"),
    "seq_bucket": (lambda v: _is_int(v) and v >= 1, "a positive int"),
}


def _key_problem(e: dict) -> Optional[str]:
    """What is wrong with an entry's key fields: known ones by their checks, others (a
    family's own) must be a string, an int or a bool."""
    for k in ("gpu", "kernel"):
        if not isinstance(e[k], str):
            return f"{k} must be a string, got {e[k]!r}"
    for k in key_fields(entry_family(e)) or ():
        ok, what = _FIELD_CHECKS.get(k, (lambda v: isinstance(v, (str, int)), "a string, "
                                                                             "an int or a bool"))
        if not ok(e[k]):
            return f"{k} must be {what}, got {e[k]!r}"
    return None


def _entry_problem(e: dict) -> Optional[str]:
    """What is wrong with one entry's fields ("field: why"), or None. Every field a lookup,
    spak.fmha or `spak store show` reads is checked, so a corrupt store is reported (and
    ignored by lookup) instead of crashing them later."""
    bad = _key_problem(e)
    if bad:
        return bad
    t = e["tiles"]
    if not isinstance(t, dict):
        return f"tiles must be an object, got {t!r}"
    tiles = [k for k in t if "TILE" in k] if entry_family(e) != DEFAULT_FAMILY \
        else ["TILE_M", "TILE_N"]
    for k in tiles:
        n = t.get(k)
        if not _is_int(n) or not 16 <= n <= 256 or n & (n - 1):
            return f"tiles.{k} must be a power of two in [16, 256], got {n!r}"
    for k, v in t.items():
        if v is not None and (not _is_int(v) or v < 0):
            return f"tiles.{k} must be a non-negative int or null, got {v!r}"
    if e.get("max_rows") is not None and not (_is_int(e["max_rows"]) and e["max_rows"] >= 1):
        return f"max_rows must be a positive int or absent, got {e['max_rows']!r}"
    for k in _INFO_NUM:
        if e.get(k) is not None and not _is_num(e[k]):
            return f"{k} must be a number or null, got {e[k]!r}"
    for k in _INFO_STR:
        if e.get(k) is not None and not isinstance(e[k], str):
            return f"{k} must be a string or null, got {e[k]!r}"
    return None


# ------------------------------------------------------------------ reading

_cache: dict = {}


def load_store(path=None) -> dict:
    """The store as a dict of the current version (a version-1 file is read as version 2);
    a missing file is an empty store. Raises TunedStoreError."""
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
        _cache[key] = {**_validate(doc, p), "version": FORMAT_VERSION}
    return _cache[key]


def lookup(gpu_name: str, kernel: str, dtype, head_dim: int, causal: bool, seq_len: int,
           *, path=None, strict: bool = False, family: str = DEFAULT_FAMILY,
           rows: Optional[int] = None) -> Optional[dict]:
    """The tuned tiles {"TILE_M", "TILE_N", ...} for an attention problem of ``family``
    (default: the FMHA forward), or None. Entries for ``gpu_name`` win; without any, those
    of a GPU of the same arch are used. ``rows``: the problem's query rows (B * Hq * Sq),
    for the small-grid entries (module doc); None: general entries only.

    A corrupt store warns and returns None (strict=False, what spak.fmha uses: a bad
    store must not stop attention from running) or raises TunedStoreError (strict=True).
    """
    key = {"dtype": normalize_dtype(dtype), "head_dim": int(head_dim), "causal": bool(causal),
           "seq_bucket": seq_bucket(seq_len)}
    return lookup_key(family, gpu_name, kernel, key, path=path, strict=strict, rows=rows)


def lookup_key(family: str, gpu_name: str, kernel: str, key: dict, *, path=None,
               strict: bool = False, rows: Optional[int] = None) -> Optional[dict]:
    """The tuned config of ``family`` filed under ``key`` (its ``store_key`` of a problem),
    or None: the entries whose key fields equal ``key``'s, fields named "..._bucket"
    aside, which take the nearest (see the module doc). Corrupt store: as `lookup`."""
    try:
        store = load_store(path)
    except TunedStoreError as e:
        if strict:
            raise
        warnings.warn(f"ignoring the tuned-config store: {e}", RuntimeWarning, stacklevel=3)
        return None
    buckets = [k for k in key if k.endswith("_bucket")]
    exact = {k: v for k, v in key.items() if k not in buckets}
    entries = [e for e in store["configs"] if entry_family(e) == family
               and e["kernel"] == str(kernel) and all(e.get(k) == v for k, v in exact.items())
               and _fits(e, rows)]
    mine = [e for e in entries if e["gpu"] == str(gpu_name)]
    # None tuned on this GPU: take a sibling's (same arch per spak.device.archs, e.g. an H200's
    # configs on an H100: the same SM design, and this work is compute-bound)
    best = _nearest(mine or [e for e in entries if _siblings(e["gpu"], str(gpu_name))],
                    {k: key[k] for k in buckets})
    return dict(best["tiles"]) if best is not None else None


def _fits(e: dict, rows: Optional[int]) -> bool:
    """A general entry fits any problem; a small-grid one those of at most max_rows rows."""
    limit = e.get("max_rows")
    return limit is None or rows is not None and int(rows) <= limit


def _nearest(entries, buckets: dict):
    """The entry whose buckets are nearest (summed distance in log2); ties go to the larger
    bucket, then to a small-grid entry (the tightest max_rows) over the general one."""
    best, best_rank = None, None
    for e in entries:
        dist = sum(abs(int(e[k]).bit_length() - int(b).bit_length()) for k, b in buckets.items())
        small = e.get("max_rows")
        rank = (dist, tuple(-int(e[k]) for k in buckets), small is None, small or 0)
        if best_rank is None or rank < best_rank:
            best, best_rank = e, rank
    return best


def _siblings(a: str, b: str) -> bool:
    """Two GPU names SPAK knows (spak.device.archs) with the same arch."""
    from spak.device import archs
    pa, pb = archs.lookup(a), archs.lookup(b)
    return pa is not None and pb is not None and pa.arch == pb.arch


# ------------------------------------------------------------------ writing

def make_entry(gpu_name: str, kernel: str, dtype, head_dim: int, causal: bool, seq_len: int,
               tiles: dict, **info) -> dict:
    """An FMHA-forward-keyed entry (no "family": the default); ``info`` (tflops, date,
    source, commit, family, ...) is kept as given."""
    return {"gpu": str(gpu_name), "kernel": str(kernel), "dtype": normalize_dtype(dtype),
            "head_dim": int(head_dim), "causal": bool(causal), "seq_bucket": seq_bucket(seq_len),
            "tiles": {k: int(v) for k, v in tiles.items()}, **info}


def upsert(store: dict, entry: dict) -> dict:
    """Replace the entry with the same key (`entry_key`) or append it; returns store."""
    key = entry_key(entry)
    store["configs"] = [e for e in store.get("configs", []) if entry_key(e) != key]
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
    WRITES[0] += 1                # spak.api's memoised store version looks again at once
    return p


#: [stores written by this process] (spak.api._store_version)
WRITES = [0]
