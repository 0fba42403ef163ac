"""Result rows of several GPUs of one model merged into one row per measurement.

A measurement is (family, GPU name, kernel, case, provider, config id). `spak sweep --gpus`
spreads a sweep over the GPUs of a host, and sweeps of several hosts can be read
together; each GPU keeps its identity on its rows ("host", "gpu_index"). Merging:

- rows of one GPU (same host and index; rows without them count as one GPU per name):
  the later row replaces the earlier (a newer sweep appended to a file, a later file);
- the ok rows of different GPUs of the same name: one row with the median of their
  TFLOPS (and of ms_median), "gpus" the number of GPUs and "tflops_spread" the
  (max - min) / median of their TFLOPS, so a GPU that runs slow shows;
- a measurement no GPU got an ok row for keeps its latest row (its failure).

Per-GPU figures stay visible: a merged row carries "gpu_tflops" ({"gpu0": TFLOPS, ...};
"host/gpu0" when several hosts' rows meet) and "gpus_disagree", true when the GPUs' spread
is beyond what the run-to-run noise explains: more than ``DISAGREE_FLOOR`` and more than
``DISAGREE_FACTOR`` times the widest within-run spread of the rows ("spread", the batches'
(p75 - p25) / median). `spak sweep`, `spak report` and `spak store update` name such
measurements (``disagreement_lines``), so a slow or fast GPU cannot pick an entry silently.

GPUs of different names are never merged: the store files configs per GPU name.
"""
from __future__ import annotations

import statistics

from spak import families

__all__ = ["measurement_key", "gpu_identity", "merge_gpu_rows", "merge_one",
           "disagreement_lines", "DISAGREE_FLOOR", "DISAGREE_FACTOR"]


#: Two GPUs of one model disagree on a measurement when their TFLOPS differ by more than
#: this fraction of the median: runs of one config on one H100 differed by up to ~7% at
#: D=128 (results/sweep-gpus-one-h100-2026-11-24), so smaller gaps are not evidence.
DISAGREE_FLOOR = 0.08
#: ... and by more than this many times the rows' own within-run spread.
DISAGREE_FACTOR = 3.0


def measurement_key(r: dict) -> tuple:
    return (r.get("family", families.DEFAULT), r.get("gpu"), r.get("kernel"), r.get("case"),
            r.get("provider"), r.get("config_id"))


def gpu_identity(r: dict) -> tuple:
    """(host, gpu_index): which GPU measured a row; (None, None) for a single-GPU sweep's."""
    return (r.get("host"), r.get("gpu_index"))


def merge_one(rows: list[dict]) -> dict:
    """One measurement's rows, one per GPU (of one name), merged as the module doc says."""
    return _merged(rows)


def _merged(rows: list[dict]) -> dict:
    ok = [r for r in rows if r.get("status") == "ok" and r.get("tflops")]
    if not ok:
        return rows[-1]
    if len(ok) == 1:
        return ok[0]
    tf = [float(r["tflops"]) for r in ok]
    med = statistics.median(tf)
    row = dict(max(ok, key=lambda r: r.get("date") or ""))
    spread = (max(tf) - min(tf)) / med
    noise = max((float(r["spread"]) for r in ok if isinstance(r.get("spread"), (int, float))),
                default=0.0)
    hosts = {r.get("host") for r in ok}
    row.update(tflops=med, gpus=len(ok), tflops_spread=spread,
               gpu_indices=[r.get("gpu_index") for r in ok],
               gpu_tflops={_gpu_label(r, len(hosts) > 1): float(r["tflops"]) for r in ok},
               gpus_disagree=spread > max(DISAGREE_FLOOR, DISAGREE_FACTOR * noise))
    ms = [r["ms_median"] for r in ok if isinstance(r.get("ms_median"), (int, float))]
    if len(ms) == len(ok):
        row["ms_median"] = statistics.median(ms)
    return row


def merge_gpu_rows(rows) -> list[dict]:
    """One row per measurement (see the module doc), in the order measurements first
    appear; rows other than results (kind != "result") are dropped."""
    by_key: dict = {}
    for r in rows:
        if r.get("kind") != "result":
            continue
        by_key.setdefault(measurement_key(r), {})[gpu_identity(r)] = r
    return [_merged(list(per_gpu.values())) for per_gpu in by_key.values()]


def _gpu_label(r: dict, with_host: bool) -> str:
    g = r.get("gpu_index")
    label = "gpu?" if g is None else f"gpu{g}"
    return f"{r.get('host')}/{label}" if with_host else label


def disagreement_lines(rows) -> list[str]:
    """One line per merged measurement whose GPUs disagree (see the module doc): the
    shape, provider and config, each GPU's TFLOPS and the spread."""
    out = []
    for r in rows:
        if r.get("gpus_disagree"):
            per = ", ".join(f"{k} {v:.1f}" for k, v in sorted(r["gpu_tflops"].items()))
            out.append(f"{r.get('case')} {r.get('provider')} {r.get('config_id')}: {per} "
                       f"TFLOPS (spread {r['tflops_spread']:.1%})")
    return out
