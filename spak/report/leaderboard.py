"""The leaderboard (results/leaderboard.json): the best SPAK figure per (kernel family, GPU,
kernel, dtype, shape) with the config, the git commit that set it, the date and the
results file.

An entry without a "family" field is the FMHA forward's (every entry written before
families existed); entries of another family carry "family" and hold their figure under
their family's metric field ("tflops", or "gbps" for a memory-bound family).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from spak import families
from spak.report.load import config_label, family_of
from spak.results.rows import ResultRow, metric_field

__all__ = ["LEADERBOARD_VERSION", "DEFAULT_LEADERBOARD", "candidates", "load_leaderboard",
           "update_leaderboard", "write_leaderboard", "entry_key", "entry_order",
           "entry_value"]

LEADERBOARD_VERSION = 1
DEFAULT_LEADERBOARD = Path(__file__).resolve().parents[2] / "results" / "leaderboard.json"


def _family(entry: dict) -> str:
    return entry.get("family") or families.DEFAULT


def entry_key(entry: dict) -> tuple:
    return (_family(entry), entry["gpu"], entry["kernel"], entry["dtype"], entry["case"])


def entry_order(entry: dict) -> tuple:
    """Entries in the file and in tables: by family, GPU, kernel, dtype, then shape."""
    return (_family(entry), entry["gpu"], entry["kernel"], entry["dtype"],
            entry.get("D") or 0, bool(entry.get("causal")), entry.get("Sk") or 0,
            entry["case"])


def entry_value(entry: dict) -> tuple[float, str]:
    """(the entry's figure, its metric)."""
    metric = families.get(_family(entry)).metric
    return entry[metric_field(metric)], metric


def candidates(rows: list[ResultRow]) -> dict:
    """(family, gpu, kernel, dtype, case) -> the best measured SPAK row of these results."""
    best: dict = {}
    for r in rows:
        metric = family_of(r).metric
        if not r.is_spak or not r.measure(metric):
            continue
        k = (r.family, r.gpu, r.kernel, r.dtype, r.case)
        if k not in best or r.measure(metric) > best[k].measure(metric):
            best[k] = r
    return best


def _check_entry(p: Path, i: int, e) -> None:
    if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in
                                          ("gpu", "kernel", "dtype", "case")):
        raise ValueError(f"{p}: entries[{i}] must be an object with string gpu, kernel, "
                         f"dtype and case, got {e!r}"[:300])
    fam = e.get("family", families.DEFAULT)
    if fam not in families.names():
        raise ValueError(f"{p}: entries[{i}].family: unknown kernel family {fam!r}")
    field = metric_field(families.get(fam).metric)
    t = e.get(field)
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
        raise ValueError(f"{p}: entries[{i}].{field} must be a positive number, got {t!r}")


def load_leaderboard(path) -> dict:
    """The leaderboard at `path` (empty when there is none); ValueError naming the file
    when it cannot be read or an entry is malformed."""
    p = Path(path)
    if not p.exists():
        return {"version": LEADERBOARD_VERSION, "entries": []}
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{p}: cannot read the leaderboard ({type(e).__name__}: {e}); "
                         f"fix or delete it") from None
    if not isinstance(doc, dict) or doc.get("version") != LEADERBOARD_VERSION or \
            not isinstance(doc.get("entries"), list):
        raise ValueError(f"{p}: not a version-{LEADERBOARD_VERSION} SPAK leaderboard")
    for i, e in enumerate(doc["entries"]):
        _check_entry(p, i, e)
    return doc


def _entry(key: tuple, r: ResultRow) -> dict:
    family, gpu, kernel, dtype, case = key
    fam = families.get(family)
    e = {} if family == families.DEFAULT else {"family": family}
    e.update({"gpu": gpu, "kernel": kernel, "dtype": dtype, "case": case,
              "D": r.data.get("D"), "causal": r.data.get("causal"), "Sk": r.data.get("Sk"),
              metric_field(fam.metric): round(r.measure(fam.metric), 2),
              "config_id": config_label(r), "commit": r.commit, "date": r.date[:10],
              "source": r.source, "sweep_id": r.sweep_id})
    return e


def update_leaderboard(lb: dict, rows: list[ResultRow]) -> list[str]:
    """Merge the results' best figures into ``lb`` (in place); lines saying what changed."""
    index = {entry_key(e): e for e in lb["entries"]}
    lines = []
    for k, r in candidates(rows).items():
        old = index.get(k)
        new = _entry(k, r)
        value, metric = entry_value(new)
        if old is not None and entry_value(old)[0] >= r.measure(metric):
            continue
        lines.append(f"{k[4]}: {value:.1f} {metric} ({new['config_id']})"
                     + (f", was {entry_value(old)[0]:.1f}" if old else ", new"))
        if old is not None:
            lb["entries"].remove(old)
        lb["entries"].append(new)
        index[k] = new
    return lines


def write_leaderboard(lb: dict, path) -> None:
    """Write the leaderboard (entries sorted) through a temporary file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    lb["entries"].sort(key=entry_order)
    tmp = p.with_name(p.name + ".tmp")
    tmp.write_text(json.dumps(lb, indent=1) + "\n")
    os.replace(tmp, p)
