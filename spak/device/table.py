"""`spak run`'s table: one line per (shape, our kernel), the peers' TFLOPS alongside, and
the one-line summary of a run."""
from __future__ import annotations

from spak import families
from spak.core.stats import geomean

__all__ = ["header", "format_case", "summary"]


def _f(x, fmt):
    """A cell: "-" for a missing value."""
    return "-" if x is None else fmt.format(x)


def _peer_names(fam) -> tuple[str, ...]:
    return tuple(getattr(fam, "run_peers", None) or fam.peers)


def _short(peer: str) -> str:
    """A peer's column title: "sdpa-efficient" -> "effic"."""
    return peer.split("-", 1)[-1][:5]


def header(fam=None) -> str:
    fam = fam or families.get()
    peers = " ".join(f"{_short(p):>6}" for p in _peer_names(fam))
    return (f"{'kernel':6} {'shape':22} {'causal':6} {'dtype':5} {'tiles':7} {'relL2':8} "
            f"{'vsSDPA':8} {'NaN':>4} {'sim bit%':>8} {'ulp':>5} {'ms':>8} {'TFLOPS':>7} "
            f"{'%ceil':>5} | {peers}  result")


def _peer_cell(r) -> str:
    if r is None:
        return "-"
    if r.get("skipped"):
        return "skip"
    if r.get("error"):
        return "ERR"
    return _f(r.get("tflops"), "{:.0f}")


def _tiles(t) -> str:
    """"64x128" from a config's tile sizes (every key holding "TILE", in order)."""
    sizes = [str(v) for k, v in (t or {}).items() if "TILE" in k]
    return "x".join(sizes) if sizes else "-"


def format_case(rows: list[dict], fam=None) -> list[str]:
    """Table lines for one case: one per SPAK kernel, the peers' TFLOPS alongside."""
    fam = fam or families.get()
    by = {r["provider"]: r for r in rows if not r["provider"].startswith("spak-")}
    peers = " ".join(f"{_peer_cell(by.get(p)):>6}" for p in _peer_names(fam))
    lines = []
    for r in rows:
        if not r["provider"].startswith("spak-"):
            continue
        sim = r.get("sim") or {}
        res = ("SKIP" if r.get("skipped") else "PASS" if r.get("passed") else "FAIL")
        bit = None if "fraction_bit_identical" not in sim else 100 * sim["fraction_bit_identical"]
        lines.append(
            f"{r['kernel']:6} {r['shape']:22} {'yes' if r['causal'] else 'no':6} "
            f"{r['dtype']:5} {_tiles(r.get('tiles')):7} "
            f"{_f(r.get('rel_l2'), '{:.2e}'):8} {_f(r.get('rel_l2_vs_sdpa'), '{:.2e}'):8} "
            f"{_f(r.get('nonfinite'), '{}'):>4} {_f(bit, '{:.2f}'):>8} "
            f"{_f(sim.get('max_ulp'), '{}'):>5} {_f(r.get('ms_median'), '{:.3f}'):>8} "
            f"{_f(r.get('tflops'), '{:.0f}'):>7} {_f(r.get('pct_ceiling'), '{:.0f}'):>5} | "
            f"{peers}  {res}")
        for key, label in (("error", "error"), ("skipped", "skipped")):
            if r.get(key):
                lines.append(f"    {label}: " + str(r[key]).strip().replace("\n", "\n    "))
        if sim.get("error"):
            lines.append(f"    sim error: {sim['error'].splitlines()[0]}")
    return lines + _providers_lines(rows)


def _providers_lines(rows: list[dict]) -> list[str]:
    """Every provider's time per timing mode (ms) when a case was timed: one line each,
    and each missing or skipped peer's note."""
    out = []
    for r in rows:
        modes = r.get("modes") or {}
        if modes:
            cells = "  ".join(f"{m} {_f(st.get('ms_median'), '{:.4f}')} ms"
                              if "error" not in st else f"{m} ERR"
                              for m, st in modes.items())
            rate = (f"  {r['gb_per_s']:.0f} GB/s" if r.get("gb_per_s") is not None
                    else f"  {r['tflops']:.0f} TFLOPS" if r.get("tflops") else "")
            if r.get("of_copy"):
                rate += f"  {r['of_copy']:.2f} of the same-size copy"
            out.append(f"    {r['provider']:16} {cells}{rate}")
        elif not r["provider"].startswith("spak-") and r.get("error"):
            out.append(f"    {r['provider']:16} error: {str(r['error']).splitlines()[0][:200]}")
        elif not r["provider"].startswith("spak-") and (r.get("note") or r.get("skipped")):
            out.append(f"    {r['provider']:16} skipped: {r.get('note') or r['skipped']}")
    return out


def summary(rows: list[dict], fam=None) -> str:
    """"N/M SPAK kernel cases passed; simulator bit-identical ..; fused/cudnn ..x"."""
    fam = fam or families.get()
    ours = [r for r in rows if r["provider"].startswith("spak-") and not r.get("skipped")]
    ok = sum(bool(r.get("passed")) for r in ours)
    parts = [f"{ok}/{len(ours)} SPAK kernel cases passed"]
    sims = [r["sim"] for r in ours if isinstance(r.get("sim"), dict)
            and "fraction_bit_identical" in r["sim"]]
    if sims:
        n = sum(s["elements"] for s in sims)
        frac = sum(s["fraction_bit_identical"] * s["elements"] for s in sims) / max(n, 1)
        parts.append(f"simulator bit-identical {100 * frac:.2f}% of {n} elements "
                     f"(worst {max(s['max_ulp'] for s in sims)} ulp)")
    det = [r["deterministic"] for r in ours if r.get("deterministic") is not None]
    if det:
        parts.append(f"deterministic (a second call's bits) {sum(det)}/{len(det)}")
    by_case: dict = {}
    for r in rows:
        by_case.setdefault(r["case"], {})[r["provider"]] = r
    first = f"spak-{fam.kernels[0]}"
    for other in fam.peers[:2]:
        ratios = [c[first]["tflops"] / c[other]["tflops"] for c in by_case.values()
                  if c.get(first, {}).get("tflops") and c.get(other, {}).get("tflops")]
        if ratios:
            parts.append(f"{fam.kernels[0]}/{other.split('-', 1)[-1]} "
                         f"{geomean(ratios):.2f}x geomean over {len(ratios)}")
    return "; ".join(parts)
