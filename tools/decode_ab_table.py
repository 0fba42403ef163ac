"""Before/after table of `spak run --family fmha_decode` rows: per case, each SPAK kernel's
time (splitkv: the plan as it is; splitkv_prev: without issue 33h's INDEX32 / TN_FIT rules;
the keys forms and former tiling where run), the same-size copy of the same run, the best
peer that passed, and the simulator agreement where the rows carry it.

    python tools/decode_ab_table.py after.jsonl [alt.jsonl ...] [--agree agree.jsonl]

"of copy" is the copy's time over ours (the copy moves the case's bytes); "after/before"
is splitkv_prev's time over splitkv's (> 1: the new plan is faster). Rows of one case in
several files are kept apart (file:provider), since each file is one process.
"""
from __future__ import annotations

import argparse
import json
import os
import sys


def load(path: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue                      # a line cut by a timeout
    return rows


def _ms(r):
    v = r.get("ms_median")
    return v if isinstance(v, (int, float)) and v > 0 else None


def table(paths: list[str]) -> list[str]:
    """One line a (file, case): ms of each provider, our kernels' share of the copy, the
    best passing peer, after/before."""
    out = ["| file | case | kernel ms (of copy) | copy ms | best peer ms | after/before |",
           "|---|---|---|---|---|---|"]
    for path in paths:
        cases: dict = {}
        for r in load(path):
            if "family" in r and r.get("case"):
                cases.setdefault(r["case"], []).append(r)
        for case, rows in cases.items():
            copy = next((_ms(r) for r in rows if r["provider"] == "copy"), None)
            ours = {r["provider"][5:]: (_ms(r), r.get("passed"), (r.get("tiles") or {}))
                    for r in rows if r["provider"].startswith("spak-")}
            peers = [(_ms(r), r["provider"]) for r in rows
                     if r["provider"] not in ("copy",) and not r["provider"].startswith("spak-")
                     and _ms(r) and r.get("passed", True) is not False]
            best = min(peers) if peers else None
            cells = []
            for k, (ms, ok, t) in ours.items():
                if ms is None:
                    cells.append(f"{k} - ({'FAIL' if ok is False else 'no time'})")
                    continue
                frac = f" ({copy / ms:.2f})" if copy else ""
                cells.append(f"{k} {ms:.4f}{frac}{'' if ok is not False else ' FAIL'}")
            ab = ""
            if ours.get("splitkv", (None,))[0] and ours.get("splitkv_prev", (None,))[0]:
                ab = f"{ours['splitkv_prev'][0] / ours['splitkv'][0]:.2f}"
            out.append(f"| {os.path.basename(path)} | {case} | {'; '.join(cells)} | "
                       f"{copy and f'{copy:.4f}' or '-'} | "
                       f"{best and f'{best[1]} {best[0]:.4f}' or '-'} | {ab} |")
    return out


def agree(path: str) -> list[str]:
    """Simulator agreement and float64 checks of a --no-time run."""
    out, n, ok = [], 0, 0
    for r in load(path):
        if not r.get("provider", "").startswith("spak-"):
            continue
        n += 1
        sim = r.get("sim") or {}
        same = sim.get("fraction_bit_identical")
        good = r.get("passed") is True and same == 1.0
        ok += good
        out.append(f"{'ok  ' if good else 'BAD '} {r['case']} {r['provider']} passed="
                   f"{r.get('passed')} rel_l2={r.get('rel_l2')} bit_identical={same} "
                   f"max_ulp={sim.get('max_ulp')} ({sim.get('slice')}) err={r.get('error')}")
    return [f"simulator agreement: {ok}/{n} cases passed and bit-identical"] + out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*")
    ap.add_argument("--agree", default=None)
    a = ap.parse_args(argv)
    lines = table([p for p in a.files if os.path.exists(p)])
    if a.agree and os.path.exists(a.agree):
        lines += [""] + agree(a.agree)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
