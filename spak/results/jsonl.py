"""Result files (JSON lines): writing rows so that a kill loses nothing, reading them
back past torn or corrupt lines, checking a row's field types, and turning a row into
strict JSON.

Every command that records results (`spak run`, `spak sweep`, `spak plan`) writes with
`ResultsWriter`/`append_jsonl`, and every reader (report, store update, sweep --resume,
plan --results) reads with `read_results` and skips what `row_problem` rejects.
Non-finite floats become null (NaN/Inf counts are reported in their own fields), numpy and
torch scalars become python numbers, paths become strings, dict keys become strings.
"""
from __future__ import annotations

import gzip
import lzma
import json
import math
import os
import time
from pathlib import Path, PurePath
from typing import Optional

ROOT = Path(__file__).resolve().parents[2]


def repo_path(path) -> str:
    """`path` relative to the repository when inside it (as recorded in reports), else as given."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def jsonable(x):
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, PurePath):
        return str(x)
    if hasattr(x, "item") and callable(x.item):        # numpy / torch scalars
        return jsonable(x.item())
    return x


def _open_for_append(path):
    """The file opened for appending, with a torn last line (a run killed in the middle of
    a write) ended first, so it cannot swallow the next row (readers skip the torn line)."""
    f = open(path, "a+b")
    if f.seek(0, os.SEEK_END) > 0:
        f.seek(-1, os.SEEK_END)
        if f.read(1) != b"\n":
            f.write(b"\n")
    f.seek(0, os.SEEK_END)
    return f


def _write_row(f, row: dict, sync: bool = True) -> None:
    f.write((json.dumps(jsonable(row), allow_nan=False) + "\n").encode())
    f.flush()
    if sync:
        os.fsync(f.fileno())


class ResultsWriter:
    """Append-only JSON lines. Each row is flushed to the OS before the call returns, so a
    killed process (SIGKILL, OOM, timeout) loses nothing written; fsync (which only adds a
    host crash or power loss to that) runs at most every ``sync_every_s`` and at close. A
    sweep on 4 GPUs writes ~15 rows a second while 60 compile helpers write cubins, and an
    fsync per row cost each GPU ~13 ms of idle per job there (H200 x4, 2026-11-28)."""

    def __init__(self, path, sync_every_s: float = 1.0):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.f = _open_for_append(self.path)
        self.sync_every_s = sync_every_s
        self._synced = time.monotonic()

    def write(self, row: dict) -> None:
        now = time.monotonic()
        sync = now - self._synced >= self.sync_every_s
        _write_row(self.f, row, sync)
        if sync:
            self._synced = now

    def close(self) -> None:
        if not self.f.closed:
            self.f.flush()
            os.fsync(self.f.fileno())
            self.f.close()


def append_jsonl(path: Optional[Path], row: dict) -> None:
    """Append one row to `path` (None: do nothing) and fsync it: a killed run loses
    nothing already written."""
    if path is None:
        return
    with _open_for_append(path) as f:
        _write_row(f, row)


def read_results(path, *, warn=None) -> list[dict]:
    """Every JSON object line of a results file; a torn or corrupt line (a kill in the
    middle of a write) is skipped with a warning. A missing file is empty. A name ending
    in .gz or .xz is read through gzip or lzma (committed results are kept compressed:
    the tree travels to the GPU machine under a size limit)."""
    p = Path(path)
    if not p.exists():
        return []
    rows = []
    opener = {".gz": gzip.open, ".xz": lzma.open}.get(p.suffix, open)
    with opener(p, "rt", encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                if warn:
                    warn(f"{p}:{n}: skipping a corrupt line ({line[:60]!r}...)")
                continue
            if isinstance(obj, dict):
                rows.append(obj)
            elif warn:
                warn(f"{p}:{n}: skipping a line that is not a JSON object ({line[:60]!r})")
    return rows


_ROW_STR = ("schema", "kind", "sweep_id", "date", "gpu", "arch", "commit", "kernel", "case",
            "shape", "dtype", "provider", "config_id", "status", "error", "mask")
_ROW_NUM = ("B", "Hq", "Hkv", "Sq", "Sk", "D", "flops", "ms_median", "ms_min", "ms_max",
            "ms_p25", "ms_p75", "tflops", "rel_l2", "rel_l2_vs_sdpa", "pct_ceiling")
_ROW_CFG = ("config", "tiles")
_CFG_KEYS = ("TILE_M", "TILE_N", "occupancy", "num_ctas", "LAT_K", "LAT_V")


def row_problem(r) -> Optional[str]:
    """Why a results line (spak sweep / spak run, any kind) cannot be used, or None.

    A corrupt file can hold valid JSON of the wrong shape (a hand edit, a bit flip): the
    readers (report, store update, sweep --resume) skip such a row with a warning rather
    than crash on it. Checks the types of the fields they use; absent fields are fine."""
    if not isinstance(r, dict):
        return f"not a JSON object ({type(r).__name__})"
    for k in _ROW_STR:
        if r.get(k) is not None and not isinstance(r[k], str):
            return f"{k!r} must be a string, got {r[k]!r}"
    for k in _ROW_NUM:
        v = r.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"{k!r} must be a number, got {v!r}"
    for k in _ROW_CFG:
        c = r.get(k)
        if c is None:
            continue
        if not isinstance(c, dict):
            return f"{k!r} must be an object, got {c!r}"
        for ck in _CFG_KEYS:
            v = c.get(ck)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
                return f"{k}.{ck} must be an integer, got {v!r}"
    return None
