"""The simulator's first-run message (issue 20): spak.cpu.firstrun and its use in `spak sim`.

Cold/warm is decided from a marker in numba's cache directory; these tests use a temporary
directory (never the real cache) except where they compare with numba's own answer.
"""
from __future__ import annotations

import json

import pytest

from spak.cpu import firstrun


@pytest.fixture
def ran(monkeypatch):
    """Pretend this process ran the simulator (mark_warm's precondition)."""
    monkeypatch.setattr(firstrun, "simulator_ran", lambda: True)


def fill(directory, names=("memory._scatter_py-101.py311.nbi", "fma.fma_f32-29.py311.nbi")):
    for n in names:
        (directory / n).write_bytes(b"index")


def test_cold_until_marked_then_warm(tmp_path, ran):
    fill(tmp_path)
    assert firstrun.is_cold(tmp_path)
    assert firstrun.mark_warm(tmp_path)
    assert not firstrun.is_cold(tmp_path)
    doc = json.loads((tmp_path / firstrun.MARKER).read_text())
    assert doc["index_files"] == sorted(p.name for p in tmp_path.glob("*.nbi"))
    assert "numerics.py" in doc["fingerprint"]["sources"]        # defines numba functions
    assert "errors.py" not in doc["fingerprint"]["sources"]      # does not


@pytest.mark.parametrize("change", ["index-file-gone", "source-edited", "numba-upgraded",
                                    "marker-corrupt", "marker-wrong-shape"])
def test_cold_again_when_what_the_cache_depends_on_changes(tmp_path, ran, monkeypatch,
                                                           change):
    fill(tmp_path)
    firstrun.mark_warm(tmp_path)
    marker = tmp_path / firstrun.MARKER
    real = firstrun.fingerprint()
    if change == "index-file-gone":
        next(tmp_path.glob("*.nbi")).unlink()
    elif change == "source-edited":
        monkeypatch.setattr(firstrun, "fingerprint", lambda folder=None: {
            **real, "sources": {**real["sources"], "numerics.py": "0" * 64}})
    elif change == "numba-upgraded":
        monkeypatch.setattr(firstrun, "fingerprint", lambda folder=None: {**real,
                                                                          "numba": "9.9"})
    elif change == "marker-corrupt":
        marker.write_text('{"fingerprint": ')
    else:
        marker.write_text('["not", "a", "marker"]')
    assert firstrun.is_cold(tmp_path)


def test_caching_off_is_always_cold_and_never_marked(tmp_path, ran, monkeypatch):
    fill(tmp_path)
    firstrun.mark_warm(tmp_path)
    monkeypatch.setenv("SPAK_NUMBA_CACHE", "0")
    assert firstrun.is_cold(tmp_path)
    assert not firstrun.mark_warm(tmp_path)


def test_nothing_is_marked_unless_the_simulator_ran_here(tmp_path, monkeypatch):
    fill(tmp_path)
    monkeypatch.setattr(firstrun, "simulator_ran", lambda: False)
    assert not firstrun.mark_warm(tmp_path)
    assert not (tmp_path / firstrun.MARKER).exists() and firstrun.is_cold(tmp_path)


def test_announce_prints_only_when_cold(tmp_path, ran, monkeypatch, capsys):
    monkeypatch.setattr(firstrun, "cache_dir", lambda: tmp_path)
    fill(tmp_path)
    assert firstrun.announce() is True
    err = capsys.readouterr().err
    assert "compiling the simulator's numba kernels" in err and str(tmp_path) in err
    firstrun.mark_warm()
    assert firstrun.announce() is False
    assert capsys.readouterr().err == ""


def test_cache_dir_is_where_numba_caches_the_simulator():
    """Agrees with the cache path numba itself chose for a simulator function."""
    from spak.sim import memory
    from numba.core.dispatcher import Dispatcher
    disp = next(d for d in vars(memory).values() if isinstance(d, Dispatcher)
                and d._cache is not None and hasattr(d._cache, "_cache_path"))
    assert str(firstrun.cache_dir()) == disp._cache._cache_path


def test_spak_sim_announces_on_a_cold_cache_and_marks_it_after_a_real_case(monkeypatch,
                                                                            capsys):
    import spak.cli as cli
    import spak.cli.sim as cli_sim
    from spak.core.metrics import GATES
    marked = []
    monkeypatch.setattr(firstrun, "is_cold", lambda directory=None: True)
    monkeypatch.setattr(firstrun, "mark_warm", lambda directory=None: marked.append(1))

    def run_case(kernel_name, spec, *, tiles=None, model="sm_90", seed=0):
        return {"rel_l2": 1e-4, "max_abs": 1e-4, "nonfinite": 0, "seconds": 0.0,
                "gate": GATES[spec.dtype], "passed": True, "error": None}
    monkeypatch.setattr(cli_sim, "_load_run_case", lambda family: run_case)
    code = cli.main(["sim", "--shapes", "1x2x17x64/fp16/causal", "--kernel", "fused"])
    out, err = capsys.readouterr()
    assert code == 0 and "compiling the simulator's numba kernels" in err
    assert "compiling" not in out and marked == [1]
    monkeypatch.setattr(firstrun, "is_cold", lambda directory=None: False)
    cli.main(["sim", "--shapes", "1x2x17x64/fp16/causal", "--kernel", "fused"])
    assert "compiling" not in capsys.readouterr().err and marked == [1]
