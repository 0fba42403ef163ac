"""The regression gate (`spak report --check`): every shape whose best SPAK figure in the
given results is more than a tolerance below the leaderboard's fails."""
from __future__ import annotations

from spak.report.leaderboard import candidates, entry_key, entry_value
from spak.report.load import family_of, place_of
from spak.results.rows import ResultRow

__all__ = ["check_regressions"]


def check_regressions(rows: list[ResultRow], lb: dict, tolerance: float) -> tuple[bool, list[str]]:
    """(passed, lines): every shape of the results whose best SPAK figure is more than
    ``tolerance`` below the leaderboard's fails; shapes the leaderboard lacks pass."""
    index = {entry_key(e): e for e in lb["entries"]}
    cands = candidates(rows)
    lines, ok = [], True
    if not cands:
        return False, ["no successful SPAK measurement in the results: nothing to check"]
    for k, r in sorted(cands.items(), key=lambda kv: (kv[0][0], place_of(kv[1]).order,
                                                      kv[1].case)):
        metric = family_of(r).metric
        new = r.measure(metric)
        e = index.get(k)
        if e is None:
            lines.append(f"  new   {k[4]:<32} {new:7.1f} {metric} (not on the leaderboard)")
            continue
        best = entry_value(e)[0]
        ratio = new / best
        bad = ratio < 1.0 - tolerance
        ok &= not bad
        lines.append(f"  {'FAIL' if bad else 'ok  '}  {k[4]:<32} {new:7.1f} vs {best:7.1f}"
                     f" {metric} ({ratio:.3f}x; leaderboard {e.get('config_id')} at "
                     f"{(e.get('commit') or 'unknown')[:12]})")
    return ok, lines
