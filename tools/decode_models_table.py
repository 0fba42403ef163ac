"""Issue 33's tables and plot from `spak run --family fmha_decode` rows: the model slice
against its peers and the same-size copy, paged against contiguous, bf16 against fp16,
and run-to-run stability (a case timed in two result files: two processes).

    python tools/decode_models_table.py --summary gate.jsonl second.jsonl
    python tools/decode_models_table.py gate.jsonl second.jsonl --plot models.png \
        --readme README.md          # rewrite README's block between the decode markers

Rows: JSON lines, plain or .gz (the GPU job's archive holds both files). Each table is
computed from rows of ONE run except the stability table, which pairs runs. A peer
counts as "best peer" when it ran, has no NaN/Inf and its relative L2 against float64
is within our gate on the case; the same-size copy is the bandwidth yardstick, never a
peer. Figures are the rows' `ms_median` (kernel mode: the run's first timing mode).
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import os
import re
import sys

MARK_BEGIN = "<!-- decode-models:begin (tools/decode_models_table.py --readme) -->"
MARK_END = "<!-- decode-models:end -->"
OURS = "spak-splitkv"
NAMES = {"llama3.1": "Llama-3.1", "llama2": "Llama-2", "qwen2.5": "Qwen2.5", "qwen3": "Qwen3",
         "mistral": "Mistral", "mixtral": "Mixtral", "gemma2": "Gemma-2", "phi3": "Phi-3",
         "yi": "Yi", "falcon": "Falcon", "gpt2": "GPT-2"}
SIZES = {"large": "Large", "mini": "mini", "medium": "medium"}
PEER_NAMES = {"sdpa-cudnn": "SDPA cuDNN", "sdpa-flash": "SDPA flash",
              "sdpa-efficient": "SDPA efficient", "tilegym": "TileGym", "flashinfer": "FlashInfer"}


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    with opener(path, "rt") as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue                      # a line cut by a killed run
            if isinstance(r, dict) and r.get("family") == "fmha_decode":
                rows.append({**r, "_file": path})
    return rows


def model_name(m) -> str:
    if not m:
        return "-"
    for k, v in NAMES.items():
        if m.startswith(k):
            rest = m[len(k):].lstrip("-")
            return v + ("-" + SIZES.get(rest, rest.upper().replace("8X", "8x")) if rest else "")
    return m


def layout(r) -> str:
    parts = [f"{r['page']}-key pages" if r.get("page") else "contiguous"]
    if r.get("ragged") or r.get("lens"):
        parts.append("ragged")
    if r.get("Sq", 1) > 1:
        parts.append(f"Sq {r['Sq']} causal" if r.get("causal") else f"Sq {r['Sq']}")
    return ", ".join(parts)


def shape_text(r) -> str:
    h = f"{r['Hq']}" if r["Hq"] == r["Hkv"] else f"{r['Hq']}:{r['Hkv']}"
    s = f"{r['Sk']}" if r["Sq"] == 1 else f"{r['Sq']}:{r['Sk']}"
    return f"{r['B']}x{h}x{s}x{r['D']}"


def by_case(rows) -> dict:
    """file -> case -> provider -> row (the last row of a provider wins)."""
    out: dict = {}
    for r in rows:
        out.setdefault(r["_file"], {}).setdefault(r["case"], {})[r["provider"]] = r
    return out


def timed(r) -> bool:
    return bool(r) and not r.get("skipped") and not r.get("error") and bool(r.get("ms_median"))


def best_peer(provs: dict, gate: float):
    """(name, ms) of the fastest valid peer, or None."""
    ok = [(r["ms_median"], n) for n, r in provs.items()
          if n not in (OURS, "copy") and not n.startswith("spak-") and timed(r)
          and not r.get("nonfinite") and r.get("rel_l2") is not None and r["rel_l2"] <= gate]
    return (min(ok)[1], min(ok)[0]) if ok else None


def gate_rows(cases: dict) -> list[dict]:
    """One dict a case of ours: ms, GB/s, of copy, best peer, pass."""
    out = []
    for case, provs in cases.items():
        ours = provs.get(OURS)
        if not ours:
            continue
        d = {"case": case, "row": ours, "passed": bool(ours.get("passed")),
             "ms": ours.get("ms_median"), "gbs": ours.get("gb_per_s")}
        copy = provs.get("copy")
        d["copy_ms"] = copy["ms_median"] if timed(copy) else None
        d["copy_gbs"] = copy.get("gb_per_s") if timed(copy) else None
        d["of_copy"] = d["copy_ms"] / d["ms"] if d["copy_ms"] and d["ms"] else None
        d["peer"] = best_peer(provs, ours.get("gate") or 1e-3) if d["ms"] else None
        d["vs_peer"] = d["peer"][1] / d["ms"] if d["peer"] else None
        d["peers_ran"] = [n for n, r in provs.items() if n != "copy"
                          and not n.startswith("spak-") and timed(r)]
        d["notes"] = sorted({r.get("note") or r.get("skipped") for n, r in provs.items()
                             if r.get("skipped")} - {None})
        out.append(d)
    return out


def fmt(x, spec=".3f", none="-") -> str:
    return none if x is None else format(x, spec)


def gate_table(rows: list[dict]) -> list[str]:
    lines = ["| model | B x Hq:Hkv x [Sq:]Sk x D | layout | group | ms | GB/s | of copy "
             "| best peer (ms) | speed / best peer | check |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for d in rows:
        r = d["row"]
        peer = f"{PEER_NAMES.get(d['peer'][0], d['peer'][0])} {d['peer'][1]:.3f}" \
            if d["peer"] else "none valid (NaN or over the gate)" if d["peers_ran"] \
            else "none has this form"
        lines.append(f"| {model_name(r.get('model'))} | {shape_text(r)} | {layout(r)} | "
                     f"{r['Hq'] // r['Hkv']} | {fmt(d['ms'])} | {fmt(d['gbs'], '.0f')} | "
                     f"{fmt(d['of_copy'], '.2f')} | {peer} | {fmt(d['vs_peer'], '.2f')} | "
                     f"{'PASS' if d['passed'] else 'FAIL'} |")
    return lines


def geomean(xs):
    xs = [x for x in xs if x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def targets(rows: list[dict]) -> list[str]:
    """The issue's targets on these rows (they are stated for an H100)."""
    peer = [d for d in rows if d["vs_peer"]]
    bw = [d for d in rows if d["copy_gbs"] and d["copy_gbs"] >= 2000 and d["of_copy"]]
    ok_peer = [d for d in peer if d["vs_peer"] >= 0.95]
    ok_bw = [d for d in bw if d["of_copy"] >= 0.85]
    gm = geomean([d["vs_peer"] for d in peer])
    return [f"- correctness: {sum(d['passed'] for d in rows)} of {len(rows)} cases pass the "
            f"float64 gate",
            f"- >= 0.95x the best peer: {len(ok_peer)} of the {len(peer)} cases with a peer "
            f"(worst {fmt(min((d['vs_peer'] for d in peer), default=None), '.2f')}); "
            f"{len(rows) - len(peer)} cases have no peer of their form",
            f"- geomean speed / best peer: {fmt(gm, '.3f')} (target >= 1.2)",
            f"- >= 0.85 of a same-size copy where the copy reaches 2 TB/s: {len(ok_bw)} of "
            f"{len(bw)}" + ("; missed: " + ", ".join(
                f"{model_name(d['row'].get('model'))} {shape_text(d['row'])} "
                f"{fmt(d['of_copy'], '.2f')}" for d in bw if d["of_copy"] < 0.85)
                if len(ok_bw) < len(bw) else "")]


def _key(r, *drop):
    """A case's identity without the fields named (to pair layouts or dtypes)."""
    keep = ("B", "Hq", "Hkv", "Sq", "Sk", "D", "dtype", "causal", "page", "ragged", "model")
    return tuple(r.get(k) for k in keep if k not in drop)


def page_pairs(cases: dict) -> list[tuple]:
    """(contiguous row, {page: row}) of our cases differing only in the page size."""
    groups: dict = {}
    for provs in cases.values():
        r = provs.get(OURS)
        if r and timed(r) and not r.get("ragged"):
            groups.setdefault(_key(r, "page"), {})[r.get("page") or 0] = r
    return [(by[0], by) for by in groups.values() if 0 in by and len(by) > 1]


def dtype_pairs(cases: dict) -> list[tuple]:
    """((fp16 row, its providers), (bf16 row, its providers)) of cases differing only there."""
    groups: dict = {}
    for provs in cases.values():
        r = provs.get(OURS)
        if r and timed(r):
            groups.setdefault(_key(r, "dtype"), {})[r["dtype"]] = (r, provs)
    return [(by["fp16"], by["bf16"]) for by in groups.values() if set(by) == {"fp16", "bf16"}]


def stab_pairs(files: dict) -> list[tuple]:
    """(case, provider, row 1, row 2, the copy's relative difference or None) for every
    provider timed on the same case in two files."""
    names, out = list(files), []
    for i, f1 in enumerate(names):
        for f2 in names[i + 1:]:
            for case in [c for c in files[f1] if c in files[f2]]:
                p1, p2 = files[f1][case], files[f2][case]
                c1, c2 = p1.get("copy"), p2.get("copy")
                cdiff = abs(c2["ms_median"] / c1["ms_median"] - 1) \
                    if timed(c1) and timed(c2) else None
                out += [(case, n, p1[n], p2[n], cdiff) for n in p1
                        if n in p2 and timed(p1[n]) and timed(p2[n])]
    return out


def pages_table(cases: dict) -> list[str]:
    lines = ["| model | shape | dtype | contiguous ms | 16-key pages | 64 | 256 |",
             "|---|---|---|---|---|---|---|"]
    for c, by in page_pairs(cases):
        cells = [f"{by[p]['ms_median'] / c['ms_median']:.3f}" if p in by else "-"
                 for p in (16, 64, 256)]
        lines.append(f"| {model_name(c.get('model'))} | {shape_text(c)} | {c['dtype']} | "
                     f"{c['ms_median']:.4f} | " + " | ".join(cells) + " |")
    return lines if len(lines) > 2 else []


def dtype_table(cases: dict) -> list[str]:
    lines = ["| model | shape | layout | fp16 ms | bf16 ms | bf16 / fp16 | copy bf16 / fp16 |",
             "|---|---|---|---|---|---|---|"]
    for (a, pa), (b, pb) in dtype_pairs(cases):
        ca, cb = pa.get("copy"), pb.get("copy")
        cr = cb["ms_median"] / ca["ms_median"] if timed(ca) and timed(cb) else None
        lines.append(f"| {model_name(a.get('model'))} | {shape_text(a)} | {layout(a)} | "
                     f"{a['ms_median']:.4f} | {b['ms_median']:.4f} | "
                     f"{b['ms_median'] / a['ms_median']:.3f} | {fmt(cr)} |")
    return lines if len(lines) > 2 else []


def stability_table(files: dict) -> list[str]:
    """Each provider's two medians, their difference, the larger within-run p25-p75
    spread, and the copy's difference beside it (what a same-size copy moves between runs)."""
    lines = ["| case | provider | run 1 ms | run 2 ms | difference | within-run p25-p75 "
             "| copy's difference |", "|---|---|---|---|---|---|---|"]
    for case, prov, a, b, cdiff in stab_pairs(files):
        inner = max((r["ms_p75"] - r["ms_p25"]) / r["ms_median"] for r in (a, b))
        lines.append(f"| {case} | {prov} | {a['ms_median']:.4f} | {b['ms_median']:.4f} | "
                     f"{abs(b['ms_median'] / a['ms_median'] - 1):.2%} | {inner:.2%} | "
                     f"{fmt(cdiff, '.2%')} |")
    return lines if len(lines) > 2 else []


def _span(xs, spec) -> str:
    return f"{format(min(xs), spec)}-{format(max(xs), spec)}" if xs else "-"


def condensed(files: dict) -> list[str]:
    """One line each for paged, bf16 and run-to-run (the README's block; the tables go to
    the results README)."""
    out = []
    pages = [(p, by[p]["ms_median"] / c["ms_median"]) for f in files.values()
             for c, by in page_pairs(f) for p in (16, 64, 256) if p in by]
    if pages:
        out.append("- paged / contiguous time, same run: " + ", ".join(
            f"{p}-key pages {_span([x for q, x in pages if q == p], '.3f')}"
            for p in (16, 64, 256)) + " (targets: within 10% at 16, 5% at 64 and 256)")
    dts = [b["ms_median"] / a["ms_median"] for f in files.values()
           for (a, _), (b, _) in dtype_pairs(f)]
    if dts:
        out.append(f"- bf16 / fp16 time, same run: {_span(dts, '.3f')} over {len(dts)} shapes "
                   f"(target: within 5%)")
    st = stab_pairs(files)
    ours = [abs(b["ms_median"] / a["ms_median"] - 1) for _, n, a, b, _ in st if n == OURS]
    cps = [abs(b["ms_median"] / a["ms_median"] - 1) for _, n, a, b, _ in st if n == "copy"]
    if ours:
        out.append(f"- run to run (the same calls in two processes): ours "
                   f"{_span(ours, '.2%')}, the same-size copy {_span(cps, '.2%')} over "
                   f"{len(ours)} cases (target: within the copy's spread)")
    return out


def plot(files: dict, path: str) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    first = next(iter(files.values()))
    rows = gate_rows(first)
    fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(rows)), 4.8))
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [d["of_copy"] or 0 for d in rows], 0.4, label="SPAK")
    ax.bar([x + 0.2 for x in xs], [(d["peer"] and d["copy_ms"] and d["copy_ms"] / d["peer"][1])
                                    or 0 for d in rows], 0.4, label="best peer (where one ran)")
    ax.axhline(0.85, color="grey", ls="--", lw=0.8)
    ax.set_ylabel("same-size copy time / call time")
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{model_name(d['row'].get('model'))}\n{shape_text(d['row'])}\n"
                        f"{layout(d['row'])}" for d in rows], rotation=90, fontsize=6)
    r0 = rows[0]["row"] if rows else {}
    ax.set_title(f"decode, served models' heads: {r0.get('gpu', '')}, {r0.get('dtype', '')}, "
                 f"{(r0.get('date') or '')[:10]}", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    return path


def render(files: dict, summary: bool, short: bool = False) -> list[str]:
    first = next(iter(files.values()), {})
    rows = gate_rows(first)
    r0 = rows[0]["row"] if rows else {}
    out = [f"Rows: {', '.join(os.path.basename(f) for f in files)}; {r0.get('gpu', '?')}, "
           f"{(r0.get('date') or '?')[:10]}, commit {r0.get('commit', '?')}; "
           f"`{r0.get('command', '?')}`", ""]
    out += gate_table(rows) + ["", "Targets (issue 33; stated for an H100):"] + targets(rows)
    if short:                                   # README: the other tables as one line each
        return out + condensed(files)
    for path, cases in files.items():           # pairs within one run (one file) only
        for title, lines in (("Paged / contiguous time", pages_table(cases)),
                             ("bf16 / fp16 time", dtype_table(cases))):
            if lines:
                out += ["", f"{title} ({os.path.basename(path)}: one run):", ""] + lines
    lines = stability_table(files)
    if lines:
        out += ["", "Run to run (the same case in two files: two processes):", ""] + lines
    if summary and rows:
        first_calls = [d["row"].get("first_call_s") or 0 for d in rows]
        out.append(f"\nfirst calls (cache hit ~0.1-0.3 s, compile: seconds): median "
                   f"{sorted(first_calls)[len(first_calls) // 2]:.2f} s, max "
                   f"{max(first_calls):.2f} s")
    return out


def rewrite_readme(path: str, block: list[str]) -> None:
    text = open(path).read()
    pat = re.compile(re.escape(MARK_BEGIN) + ".*?" + re.escape(MARK_END), re.S)
    if not pat.search(text):
        raise SystemExit(f"{path}: no block between {MARK_BEGIN!r} and {MARK_END!r}")
    new = pat.sub(lambda _: "\n".join([MARK_BEGIN, *block, MARK_END]), text)
    with open(path, "w") as f:
        f.write(new)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows", nargs="+", help="result files (.jsonl or .jsonl.gz), the gate's "
                    "first")
    ap.add_argument("--summary", action="store_true", help="print everything (the GPU job)")
    ap.add_argument("--plot", default=None, metavar="PNG")
    ap.add_argument("--readme", default=None, metavar="MD",
                    help="replace the block between the decode-models markers with the tables")
    a = ap.parse_args(argv)
    files = {}
    for p in a.rows:
        if os.path.exists(p):
            files[p] = by_case(load(p)).get(p, {})
        else:
            print(f"(missing: {p})", file=sys.stderr)
    if not files:
        print("no rows", file=sys.stderr)
        return 1
    lines = render(files, a.summary)
    print("\n".join(lines))
    drawn = None
    if a.plot:
        try:
            drawn = plot(files, a.plot)
            print(f"plot: {drawn}")
        except ImportError as e:
            print(f"plot: not drawn ({e})")
    if a.readme:            # the block: the model table, one line per other table, the plot
        link = os.path.relpath(drawn, os.path.dirname(os.path.abspath(a.readme))) \
            if drawn else None
        rewrite_readme(a.readme, render(files, False, short=True) + ([f"\n![served models' decode against a same-size "
                                           f"copy]({link})"] if link else []))
    return 0


if __name__ == "__main__":
    sys.exit(main())
