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


def test_shuffled_rounds_time_every_provider_each_round(monkeypatch):
    """The shared timer of ci/decode_paged_bench.py and ci/decode_gap_bench.py: one
    discarded timing of `first`, then every provider once a round in a seeded shuffle; a
    provider that raises is logged and recorded as NaN, the others go on."""
    import math
    calls, logged = [], []

    def fake(fns, reps=20):
        calls.append(fns[0])
        if fns[0] == "bad":
            raise RuntimeError("boom")
        return {"a": 1.0, "b": 2.0}[fns[0]], "graph"
    monkeypatch.setattr(bench, "_graph_time", fake)
    P = {"a": ["a"], "b": ["b"], "bad": ["bad"]}
    ms = bench.shuffled_rounds(P, ["a", "b", "bad"], 3, 7, "a", logged.append, "case")
    assert calls[0] == "a" and len(calls) == 1 + 9
    assert ms["a"] == [1.0] * 3 and ms["b"] == [2.0] * 3
    assert all(math.isnan(x) for x in ms["bad"]) and len(logged) == 3
    again = []

    def record(fns, reps=20):
        again.append(fns[0])
        return 1.0, "graph"
    monkeypatch.setattr(bench, "_graph_time", record)
    bench.shuffled_rounds(P, ["a", "b", "bad"], 3, 7, "a", logged.append, "case")
    assert again == calls                            # the same seed, the same orders


def test_time_shapes_goes_on_after_a_failed_shape():
    seen, logged = [], []

    def time_shape(s, dev, rounds, seed, emit, log):
        seen.append((s, seed))
        if s == 2:
            raise ValueError("no memory")
    bench.time_shapes([1, 2, 3], time_shape, None, 1, 100, None, logged.append)
    assert seen == [(1, 100), (2, 101), (3, 102)] and len(logged) == 1


def test_r27_grids_time_the_counts_they_name():
    for grid in (bench.r27_grid(), bench.r27b_grid(), bench.r27c_grid()):
        for c in grid:
            assert c["Sk"] >= 8192 and c["extra"]
            for cfg in c["extra"].values():
                assert cfg.get("num_splits", 1) >= 1
