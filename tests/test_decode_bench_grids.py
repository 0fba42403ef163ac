"""ci/decode_bench.py's 2026-11-24d grids on the CPU (no GPU, nothing launched): the former
split rule it times as the baseline ("prev") reproduces that rule's counts, and "prev" is
timed exactly where the current rule's count differs."""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "ci"))

import decode_bench as bench  # noqa: E402
from spak.gpu.plan_decode import auto_splits  # noqa: E402


def test_former_splits_are_the_former_rule():
    # the counts run 1 and run 2 timed as the rule's (results/decode-h100-2026-11-24d)
    assert bench.former_splits(bench._case(64, 1, 1, 8192)) == 8
    assert bench.former_splits(bench._case(1, 32, 1, 8192)) == 16
    assert bench.former_splits(bench._case(8, 8, 1, 8192)) == 8
    assert bench.former_splits(bench._case(8, 1, 4, 8192)) == 15
    assert bench.former_splits(bench._case(1, 1, 1, 32768)) == 132


def test_prev_is_timed_where_the_counts_differ():
    cases = bench.goal_prev_grid()
    assert len(cases) == 126
    for c in cases:
        new = auto_splits(c["B"], c["Hq"], c["Hkv"], c["Sq"], c["Sk"], 128, 64, 132, c["D"])
        old = bench.former_splits(c)
        assert ("extra" in c) == (new != old)
        if new != old:
            assert c["extra"] == {"prev": {"num_splits": old}}


def test_recheck_grid_interleaves_both_rules():
    cases = bench.recheck_grid()
    assert len(cases) == 16 and cases[:8] == cases[8:]
    for c in cases:
        assert list(c["extra"]) == ["prev", "new2", "prev2", "new3", "prev3"]
        assert c["extra"]["prev"] != c["extra"]["new2"]


def test_every_graph_replay_makes_at_least_min_calls():
    # one input set (K + V >= 256 MB) is called MIN_CALLS times a replay, so the replay's
    # fixed cost is spread as for the smaller caches; several sets keep their rotation
    assert bench.call_cycle(["a"]) == ["a"] * bench.MIN_CALLS
    assert bench.call_cycle(["a", "b"]) == ["a", "b"] * (bench.MIN_CALLS // 2)
    sets = [str(i) for i in range(8)]
    assert bench.call_cycle(sets) == sets
    assert bench.MIN_CALLS >= 4
