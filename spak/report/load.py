"""Reading results for `spak report`: rows of `spak sweep` and `spak run` files in one
shape (`report_row`), the last measurement of each (shape, provider, config) kept
(`load_rows`), and grouped into sections per (GPU, kernel family, kernel, dtype) with
each shape's providers side by side (`sections`).

Every row is read through its kernel family (a row without a "family" field is the FMHA
forward's): the family parses the row's case, says where the shape goes in the tables
(`KernelFamily.report_place`), which metric it is measured in (TFLOPS or GB/s) and which
peers sit beside SPAK.
"""
from __future__ import annotations

import sys
from typing import Callable, Iterable, Optional

from spak import families
from spak.families.base import ReportPlace
from spak.results.jsonl import read_results, repo_path, row_problem
from spak.results.rows import ResultRow, tiles_label
from spak.tune.merge import gpu_identity, merge_one

__all__ = ["report_row", "load_rows", "family_of", "place_of", "sections", "config_label",
           "config_order", "section_families", "section_peers", "fwd_bwd_providers"]


def fwd_bwd_providers(fam) -> tuple[str, ...]:
    """A training family's forward+backward providers (e.g. "fwd+bwd:spak-fused",
    "fwd+bwd:sdpa-cudnn"; `spak run --family fmha_bwd` times them), SPAK's first."""
    names = tuple(getattr(fam, "fwd_bwd_peers", ()) or ())
    return tuple(sorted(names, key=lambda n: "spak" not in n))

def family_of(row: ResultRow):
    return families.get(row.family)


def _run_row(r: ResultRow, fam) -> Optional[dict]:
    """A `spak run` row mapped onto a sweep row: its tiles as the config, a status."""
    if not (r.is_spak or r.provider in fam.peers or r.provider in fwd_bwd_providers(fam)) \
            or r.case is None or r.skipped:
        return None
    row = dict(r)
    if r.is_spak:
        t = r.tiles
        row["config"] = ({k: t.get(k) for k in fam.tile_keys}
                         | {k: None for k in fam.space_keys if k not in fam.tile_keys}) \
            if t else None
        row["config_id"] = "run " + (tiles_label({k: t.get(k) for k in fam.tile_keys})
                                     if t else "?")
        row["kernel"] = r.kernel or r.provider[len("spak-"):]
        ok = r.passed and not r.error
    else:
        row["config_id"] = "-"
        ok = not r.error
    row["status"] = "ok" if ok and r.value(fam.metric) else ("error" if r.error
                                                             else "wrong_result")
    return row


def report_row(raw: dict, source: str) -> Optional[ResultRow]:
    """A result line in one shape (sweep rows as they are, run rows mapped onto them), or
    None for lines that are not measurements (a sweep's start/end, `spak run`'s matmul
    ceiling, skipped rows)."""
    r = ResultRow(raw)
    if r.command == "sweep":
        if r.line_kind != "result":
            return None
        row = dict(raw)
    elif r.command == "run":
        row = _run_row(r, family_of(r))
        if row is None:
            return None
    else:
        return None
    if "case" not in row or "provider" not in row:
        return None
    row["_source"] = source
    row.setdefault("config_id", "-")
    return ResultRow(row)


def load_rows(paths: Iterable, warn: Callable[[str], None] = None) -> list[ResultRow]:
    """Result rows of every file, in one shape; later duplicates of one GPU replace earlier
    ones, and rows of several GPUs of one model are merged (spak.tune.merge: median TFLOPS,
    "gpus", "tflops_spread"). Malformed rows and rows of an unknown kernel family are
    skipped with a warning."""
    warn = warn or (lambda m: print("warning: " + m, file=sys.stderr))
    latest: dict = {}
    for p in paths:
        for n, raw in enumerate(read_results(p, warn=warn), 1):
            bad = row_problem(raw)
            if bad:
                warn(f"{p}: skipping malformed row {n} ({bad})")
                continue
            if ResultRow(raw).family not in families.names():
                warn(f"{p}: skipping row {n} of unknown kernel family "
                     f"{ResultRow(raw).family!r} (this SPAK knows {', '.join(families.names())})")
                continue
            row = report_row(raw, repo_path(p))
            if row is None:
                continue
            key = (row.family, row.gpu, row.kernel if row.is_spak else None, row.case,
                   row.provider, row.config_id)
            per_gpu = latest.pop(key, {})
            per_gpu[gpu_identity(raw)] = row          # a later row of one GPU replaces
            latest[key] = per_gpu
    # several GPUs of one model (spak sweep --gpus, or several hosts): one row per
    # measurement, the median over the GPUs, with "gpus" and "tflops_spread" (as the store)
    return [rows[0] if len(rows) == 1 else ResultRow(merge_one([dict(r) for r in rows]))
            for rows in (list(g.values()) for g in latest.values())]


_PLACES: dict = {}


def place_of(row: ResultRow) -> ReportPlace:
    """Where the row's shape goes in the report (its family's `report_place`)."""
    key = (row.family, row.case)
    if key not in _PLACES:
        fam = family_of(row)
        try:
            _PLACES[key] = fam.report_place(fam.parse(row.case))
        except Exception:  # noqa: BLE001 -- a case the family cannot read: a table of its own
            _PLACES[key] = ReportPlace(group=(), heading="other shapes",
                                       title="other shapes", tag="other", columns=(),
                                       size=None, sized=False, axis="Shape", order=())
    return _PLACES[key]


def _sort_key(row: ResultRow) -> tuple:
    place = place_of(row)
    return (families.names().index(row.family), not place.order, place.order, row.case)


def config_label(row: Optional[ResultRow]) -> str:
    """How tables name a SPAK row's config: "default (64x128)" or its config id."""
    if row is None:
        return "-"
    if row.is_default_config:
        fam = family_of(row)
        return f"default ({tiles_label({k: row.config.get(k) for k in fam.tile_keys})})"
    return row.config_id


def config_order(row: ResultRow) -> tuple:
    """Configs in tables: by their space keys' values (absent first)."""
    c = row.config
    return tuple(-1 if c.get(k) is None else int(c[k]) for k in family_of(row).space_keys)


def _new_case(row: ResultRow, fam) -> dict:
    case = {"meta": row, "place": place_of(row), "tuned": None, "default": None,
            "configs": {}}
    case.update({p: None for p in section_peers(fam)})
    return case


def sections(rows: list[ResultRow]) -> dict:
    """{(gpu, family, kernel, dtype): {case: {"meta": row, "place": ReportPlace,
    "tuned": row|None, "default": ..., <peer>: ..., "configs": {config_id: row}}}}, in shape
    order. Peer rows (kernel-independent) join every kernel of their GPU, family and
    dtype."""
    kernels: dict = {}
    for r in rows:
        if r.is_spak:
            kernels.setdefault((r.gpu, r.family, r.dtype), set()).add(r.kernel)
    out: dict = {}
    for r in sorted(rows, key=_sort_key):
        fam = family_of(r)
        ks = [r.kernel] if r.is_spak else \
            sorted(kernels.get((r.gpu, r.family, r.dtype), set()) or {r.kernel})
        for k in ks:
            sec = out.setdefault((r.gpu, r.family, k, r.dtype), {})
            c = sec.setdefault(r.case, _new_case(r, fam))
            if not r.is_spak:
                c[r.provider] = r
                continue
            name = "default" if r.is_default_config else r.config_id
            c["configs"][name] = r
            if r.is_default_config:
                c["default"] = r
            t = r.measure(fam.metric)
            if t and (c["tuned"] is None or t > c["tuned"].measure(fam.metric)):
                c["tuned"] = r
    return out


def section_families(secs: dict) -> list[str]:
    return list(dict.fromkeys(fam for _, fam, _, _ in secs))


def section_peers(fam) -> tuple[str, ...]:
    """The peers a family's tables show, in column order."""
    return tuple(fam.compared_peers or fam.peers)
