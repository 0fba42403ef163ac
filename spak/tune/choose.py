"""The tuned-config store, written from sweep results: `spak store` and `spak sweep --update-store`.

The store is spak/data/tuned_configs.json (format and reader: spak.tune.store, whose ``lookup``
spak.fmha calls). One entry per

    (GPU name, kernel, dtype, head dim, causal, sequence-length bucket)

where the bucket is ``spak.tune.store.seq_bucket(Sk)``: the power of two at or above the key
length, at least 128 (Sk = 1000 and 1024 share bucket 1024; 4096 is its own). A lookup
takes the entry of the problem's bucket, else the nearest bucket in log2 for the same
(GPU, kernel, dtype, head dim, causal), the larger on a tie, else nothing (spak.fmha then
uses gpu.plan.default_tiles). The GPU name must match exactly
(``torch.cuda.get_device_name()``): an H100 entry never serves an H200.

Choosing an entry. From the results' "ok" rows of one (GPU, kernel, dtype, head dim,
causal, bucket) group, each config (the swept ones and the default tiles, which compete
too) is scored by the geometric mean of its TFLOPS over the group's shapes; only configs
measured on the most shapes compete (a config missing a shape cannot win it). The
winner's tiles, and its occupancy / num_ctas hints when set, go into the entry with its
TFLOPS, the default tiles' TFLOPS, the date and commit of the measurement and the results
file. Since the default tiles compete, the stored config is never slower than the default
in the run that chose it. Rows of several GPUs of the same name (`spak sweep --gpus`, or
several hosts' files) are merged first: per config and shape the median TFLOPS across the
GPUs; the entry then records "gpus" and "tflops_spread", the largest (max - min) / median
of the winner's shapes, and "gpus_disagree" ({case: {gpu: TFLOPS}}) where the GPUs'
figures for the winner differ beyond the run-to-run noise (spak.tune.merge; the update's
line warns). One GPU's later rows replace its earlier ones.

    spak store update results/sweep-*.jsonl      # merge a sweep's winners into the store
    spak store show                              # the store as a table
    spak store lookup "NVIDIA H100 80GB HBM3" fused fp16 128 yes 4096
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from spak import families
from spak.core.stats import geomean
from spak.results.jsonl import read_results, repo_path, row_problem
from spak.tune import store as tuned
from spak.tune.merge import merge_gpu_rows
from spak.tune.space import config_id, tile_keys

__all__ = ["choose", "update_store", "format_store", "config_text"]


def _usable(r: dict, fam) -> bool:
    """Whether a result row has what choose() needs, with the right types."""
    if row_problem(r) or r.get("tflops", 0) <= 0:
        return False
    if not all(isinstance(r.get(k), str) for k in ("gpu", "kernel", "case", "config_id")):
        return False
    if not all(isinstance(r.get(k), int) and r[k] >= 1 for k in ("D", "Sk") if k in r):
        return False
    if not all(isinstance(r["config"].get(k), int) for k in tile_keys(fam.space_keys)):
        return False
    try:
        tuned.normalize_dtype(r.get("dtype"))
    except ValueError:
        return False
    return True


def _candidate(r: dict, family: str, gpu, kernel) -> bool:
    """An ok row of one of our configs, of this family (and GPU and kernel when given)."""
    if r.get("kind") != "result" or r.get("status") != "ok" or not r.get("tflops"):
        return False
    if not str(r.get("provider", "")).startswith("spak-") or not r.get("config"):
        return False
    if r.get("family", families.DEFAULT) != family:
        return False
    if gpu is not None and r.get("gpu") != gpu or kernel is not None and \
            r.get("kernel") != kernel:
        return False
    return True


def _hinted(r: dict) -> bool:
    cfg = r["config"]
    return cfg.get("occupancy") is not None or cfg.get("num_ctas") is not None


def _groups(rows, fam, tiles_only, gpu, kernel) -> dict:
    """(gpu, kernel, store key values) -> config id -> case -> row. One GPU's later rows
    (a newer sweep appended to a file, a later file) replace its earlier ones; several
    GPUs' rows of one name are merged (spak.tune.merge: the median TFLOPS)."""
    groups: dict = {}
    keys: dict = {}                      # case -> store key (parsed once per case)
    candidates = [r for r in rows if _candidate(r, fam.name, gpu, kernel)
                  and _usable(r, fam)    # a malformed row of a corrupt file: not a candidate
                  and not (tiles_only and _hinted(r))]
    for r in merge_gpu_rows(candidates):
        case = r["case"]
        if case not in keys:
            try:
                keys[case] = tuple(fam.store_key(fam.parse(case)).items())
            except ValueError:           # ShapeError: a case this family cannot read
                keys[case] = None
        if keys[case] is None:
            continue
        cid = "default" if str(r["provider"]).endswith("-default") else r["config_id"]
        groups.setdefault((r["gpu"], r["kernel"], keys[case]), {}) \
            .setdefault(cid, {})[case] = r
    return groups


def _entry(fam, key, by_cfg: dict, min_gain: float = 0.0) -> dict:
    """The store entry of one group: the config with the best geomean TFLOPS over the
    group's shapes among those measured on the most shapes (the default config too). With
    ``min_gain`` > 0 another config must beat the default by that fraction, else the
    default is filed (a one-pass sweep's near-ties are noise, not a reason to leave the
    planner's rule)."""
    most = max(len(m) for m in by_cfg.values())
    scored = [(geomean(r["tflops"] for r in m.values()), cid, m)
              for cid, m in by_cfg.items() if len(m) == most]
    scored.sort(key=lambda t: (-t[0], t[1] != "default", t[1]))
    dflt_row = next((t for t in scored if t[1] == "default"), None)
    if min_gain > 0 and dflt_row is not None and scored[0][0] < dflt_row[0] * (1 + min_gain):
        scored.insert(0, dflt_row)
    score, cid, m = scored[0]
    dflt = by_cfg.get("default")
    any_row = max(m.values(), key=lambda r: r.get("date") or "")
    # a negative knob is the planner's "choose for me" (e.g. the decode default's KT_FORM
    # -1): the same as leaving the key out, which is how the store files it
    tiles = {k: int(v) for k, v in any_row["config"].items() if v is not None and int(v) >= 0}
    gpu_name, kern, fields = key
    dflt_score = geomean(dflt[c]["tflops"] for c in m if c in dflt) \
        if dflt and all(c in dflt for c in m) else None
    gpus = max(r.get("gpus", 1) for r in m.values())
    merged = {"gpus": gpus, "tflops_spread": round(max(r.get("tflops_spread", 0.0)
                                                       for r in m.values()), 4)} \
        if gpus > 1 else {}
    disagree = sorted(c for c, r in m.items() if r.get("gpus_disagree"))
    if disagree:        # the GPUs' figures for the winner differ beyond the noise
        merged["gpus_disagree"] = {c: m[c]["gpu_tflops"] for c in disagree}
    return {"family": fam.name, "gpu": gpu_name, "kernel": kern, **dict(fields),
            "tiles": tiles,
            "config_id": cid if cid != "default" else f"default ({_tiles_text(fam, tiles)})",
            "tflops": round(score, 2),
            "default_tflops": None if dflt_score is None else round(dflt_score, 2),
            "speedup_vs_default": None if not dflt_score else round(score / dflt_score, 4),
            "cases": sorted(m), "date": (any_row.get("date") or "")[:10],
            "commit": any_row.get("commit"), "sweep_id": any_row.get("sweep_id"),
            "source": any_row.get("_source"), **merged}


def choose(rows: Iterable[dict], *, tiles_only: bool = False, gpu: Optional[str] = None,
           kernel: Optional[str] = None, family: str = families.DEFAULT,
           min_gain: float = 0.0) -> list[dict]:
    """Store entries (spak.tune.store format) chosen from result rows (see the module doc).

    ``tiles_only``: only configs without occupancy/num_ctas hints compete (for a spak.fmha
    that applies the tiles dict alone). ``min_gain``: see _entry. Rows carry "_source"
    (their file) when read by update_store. Rows without "family" are the FMHA forward's.
    """
    fam = families.get(family)
    entries = [_entry(fam, key, by_cfg, min_gain)
               for key, by_cfg in _groups(rows, fam, tiles_only, gpu, kernel).items()]
    entries.sort(key=_sort_key)
    return entries


def _sort_key(e: dict) -> tuple:
    """Entries in key order: numbers (and bools) by value, anything else as text."""
    return tuple((0, x) if isinstance(x, (int, float)) else (1, str(x))
                 for x in tuned.entry_key(e))


def _change_line(e: dict, prev: Optional[dict]) -> str:
    what = "new" if prev is None else ("same" if prev.get("tiles") == e["tiles"]
                                       else f"was {config_text(prev['tiles'])}")
    fields = tuned.key_fields(tuned.entry_family(e)) or ()
    if fields == tuned.V1_FIELDS:
        where = (f"{e['dtype']} D={e['head_dim']} "
                 f"{'causal' if e['causal'] else 'noncausal'} S<={e['seq_bucket']}")
    else:
        where = " ".join(f"{k}={e[k]}" for k in fields)
    fam = "" if tuned.entry_family(e) == families.DEFAULT else f"{tuned.entry_family(e)} "
    return (f"{e['gpu']} {fam}{e['kernel']} {where}: {config_text(e['tiles'])} "
            f"{e['tflops']:.1f} TFLOPS"
            + (f" ({e['speedup_vs_default']:.3f}x default)" if e.get("speedup_vs_default")
               else "") + f" [{what}]"
            + (f"; WARNING: its GPUs disagree on {', '.join(sorted(e['gpus_disagree']))}"
               f" ({_per_gpu_text(e['gpus_disagree'])})" if e.get("gpus_disagree") else ""))


def _per_gpu_text(d: dict) -> str:
    return "; ".join(", ".join(f"{g} {v:.1f}" for g, v in sorted(per.items()))
                     for per in d.values())


def update_store(results: Iterable, path=None, *, tiles_only: bool = False,
                 gpu: Optional[str] = None, kernel: Optional[str] = None,
                 dry_run: bool = False, family: str = families.DEFAULT,
                 min_gain: float = 0.0) -> list[str]:
    """Merge the winners of the results files into the store (atomic write); returns one
    line per entry saying what changed."""
    rows = []
    for f in results:
        for r in read_results(f):
            r["_source"] = repo_path(f)
            rows.append(r)
    entries = choose(rows, tiles_only=tiles_only, gpu=gpu, kernel=kernel, family=family,
                     min_gain=min_gain)
    store = tuned.load_store(path) if Path(tuned.store_path(path)).exists() else \
        {"version": tuned.FORMAT_VERSION, "configs": []}
    store = {**store, "configs": list(store.get("configs", []))}
    old = {tuned.entry_key(e): e for e in store["configs"]}
    lines = []
    for e in entries:
        lines.append(_change_line(e, old.get(tuned.entry_key(e))))
        store = tuned.upsert(store, e)
    if not entries:
        lines.append("no ok results to choose from: store unchanged")
    elif not dry_run:
        store.setdefault("description", "Best tile config per (family, gpu, kernel, and the "
                         "family's store fields: dtype, head_dim, causal, seq_bucket for "
                         "fmha_fwd), written by `spak sweep --update-store` / `spak store "
                         "update`; read by spak.fmha through spak.tune.store.lookup.")
        store["configs"].sort(key=_sort_key)
        p = tuned.write_store(store, path)
        lines.append(f"wrote {len(store['configs'])} entries to {p}")
    return lines


def config_text(t: dict) -> str:
    """A stored config as text: "64x128/o2/c1", knobs as "/LAT_K=4"."""
    keys = [k for k in t if "TILE" in k] + ["occupancy", "num_ctas"]
    return config_id(t, keys)


def _tiles_text(fam, tiles: dict) -> str:
    keys = tile_keys(fam.space_keys)
    return config_id({k: tiles[k] for k in keys if k in tiles}, keys)


def format_store(store: dict, family: str = families.DEFAULT) -> str:
    """The store's entries of one family as a table."""
    hdr = (f"{'gpu':<26} {'kernel':<6} {'dtype':<5} {'D':>4} {'causal':<6} {'bucket':>6} "
           f"{'config':<14} {'TFLOPS':>7} {'vs def':>7} {'date':<10} source")
    lines = [hdr]
    for e in store.get("configs", []):
        if tuned.entry_family(e) != family:
            continue
        lines.append(f"{e['gpu'][:26]:<26} {e['kernel']:<6} {e.get('dtype', '-'):<5} "
                     f"{e.get('head_dim', '-'):>4} "
                     f"{('yes' if e['causal'] else 'no') if 'causal' in e else '-':<6} "
                     f"{e.get('seq_bucket', '-'):>6} "
                     f"{config_text(e['tiles']):<14} "
                     f"{e.get('tflops') or float('nan'):7.1f} "
                     f"{e.get('speedup_vs_default') or float('nan'):7.3f} "
                     f"{e.get('date') or '-':<10} {e.get('source') or '-'}")
    return "\n".join(lines)
