"""spak run's timing in turns (spak.device.timing.time_turns, spak.device.case.time_providers),
without a GPU: torch.cuda.synchronize and time_events are replaced by recorders."""
import pytest
import torch

from spak.device import case, timing


def _fake_events(monkeypatch, medians):
    """time_events returns, per call of provider fn, the next median of medians[name]."""
    calls = []

    def fake_time_events(fn, n_sets, **kw):
        name = fn.__name__
        calls.append((name, n_sets))
        return {"ms_median": medians[name].pop(0), "ms_min": 0.0}
    monkeypatch.setattr(timing, "time_events", fake_time_events)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    return calls


def _fn(name):
    def f(i):
        pass
    f.__name__ = name
    return f


def test_time_turns_times_each_provider_in_three_orders_and_keeps_its_best(monkeypatch):
    calls = _fake_events(monkeypatch, {"a": [3.0, 1.0, 2.0], "b": [5.0, 6.0, 4.0],
                                       "c": [7.0, 7.5, 8.0]})
    fns = {n: _fn(n) for n in "abc"}
    best = timing.time_turns(fns, fns["a"], seed=1, n_sets=4, spin_s=0.0)
    assert {k: v["ms_median"] for k, v in best.items()} == {"a": 1.0, "b": 4.0, "c": 7.0}
    names = [n for n, _ in calls]
    assert names[:3] == ["a", "b", "c"] and names[3:6] == ["c", "b", "a"]
    assert sorted(names[6:]) == ["a", "b", "c"]
    assert {n_sets for _, n_sets in calls} == {4}


def test_time_alternating_returns_the_best_medians(monkeypatch):
    _fake_events(monkeypatch, {"x": [2.0, 1.5, 1.7], "y": [0.9, 1.1, 1.0]})
    fns = {n: _fn(n) for n in "xy"}
    monkeypatch.setattr(timing.time, "time", iter([0.0, 2.0]).__next__)   # no spin loop
    assert timing.time_alternating(fns, fns["x"], seed=0) == {"x": 1.5, "y": 0.9}


def test_time_providers_attaches_stats_to_the_timed_rows(monkeypatch):
    rows = [{"provider": "spak-fused"}, {"provider": "sdpa-cudnn"},
            {"provider": "sdpa-flash", "skipped": "not supported"}]
    seen = {}

    def fake_turns(timers, spin, seed, n_sets, contexts, mode, reps):
        seen.update(names=list(timers), n_sets=n_sets, seed=seed)
        assert (mode, reps) == ("kernel", 3)
        return {n: {"ms_median": 1.0 + i} for i, n in enumerate(timers)}
    monkeypatch.setattr(timing, "time_turns", fake_turns)
    case.time_providers(rows, {"spak-fused": _fn("f"), "sdpa-cudnn": _fn("c")}, 5, seed=7)
    assert seen == {"names": ["spak-fused", "sdpa-cudnn"], "n_sets": 5, "seed": 7}
    assert rows[0]["ms_median"] == 1.0 and rows[1]["ms_median"] == 2.0
    assert rows[0]["timing"] == rows[1]["timing"] == "in turns"
    assert rows[0]["input_sets"] == 5
    assert rows[0]["modes"] == {"kernel": {"ms_median": 1.0, "timing": "in turns"}}
    assert "ms_median" not in rows[2]


def test_time_providers_falls_back_to_one_at_a_time_and_records_a_failure(monkeypatch):
    rows = [{"provider": "spak-fused"}, {"provider": "sdpa-cudnn"}]

    def turns_fail(*a, **k):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory")

    def alone(fn, n_sets, **kw):
        if fn.__name__ == "c":
            raise RuntimeError("cuDNN failed")
        return {"ms_median": 0.5}
    monkeypatch.setattr(timing, "time_turns", turns_fail)
    monkeypatch.setattr(timing, "time_events", alone)
    case.time_providers(rows, {"spak-fused": _fn("f"), "sdpa-cudnn": _fn("c")}, 2, seed=0)
    assert rows[0]["ms_median"] == 0.5 and rows[0]["timing"] == "alone"
    assert "cuDNN failed" in rows[1]["error"] and "ms_median" not in rows[1]


def test_no_timers_leaves_rows_alone():
    rows = [{"provider": "spak-fused", "error": "boom"}]
    case.time_providers(rows, {}, 3, seed=0)
    assert rows == [{"provider": "spak-fused", "error": "boom"}]


def test_a_providers_context_is_held_around_its_timing_only(monkeypatch):
    # SDPA's backend choice: entered once per timing turn, not once per call
    log = []

    class Ctx:
        def __enter__(self):
            log.append("enter")

        def __exit__(self, *exc):
            log.append("exit")

    def fake_time_events(fn, n_sets, **kw):
        log.append(fn.__name__)
        return {"ms_median": 1.0}
    monkeypatch.setattr(timing, "time_events", fake_time_events)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    fns = {"ours": _fn("ours"), "cudnn": _fn("cudnn")}
    timing.time_turns(fns, fns["ours"], seed=0, reps=1, spin_s=0.0, contexts={"cudnn": Ctx})
    assert log == ["ours", "enter", "cudnn", "exit"]

    log.clear()                                   # the one-at-a-time fallback holds it too
    monkeypatch.setattr(timing, "time_turns", lambda *a, **k: 1 / 0)
    rows = [{"provider": "ours"}, {"provider": "cudnn"}]
    case.time_providers(rows, fns, 3, seed=0, contexts={"cudnn": Ctx})
    assert log == ["ours", "enter", "cudnn", "exit"]
