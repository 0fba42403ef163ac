"""The coverage table (sim/support.py, docs/sim-coverage.md) against the installed cuda.tile."""
import importlib.util
from pathlib import Path

import cuda.tile as ct

from spak.sim import support
from spak.sim.fake_ct import FAKE_CT

ROOT = Path(__file__).resolve().parents[1]


def _cov():
    spec = importlib.util.spec_from_file_location("sim_coverage", ROOT / "tools" / "sim_coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_public_cuda_tile_name_is_in_the_table():
    missing = [n for n in dir(ct) if not n.startswith("_") and n not in support.SUPPORT]
    assert not missing, f"add these to sim/support.py and rerun tools/sim_coverage.py: {missing}"


def test_table_agrees_with_the_simulator_and_the_doc_is_fresh():
    cov = _cov()
    assert cov.problems() == []
    assert (ROOT / "docs" / "sim-coverage.md").read_text() == cov.render(), \
        "docs/sim-coverage.md is stale: run python tools/sim_coverage.py"


def test_the_check_catches_a_name_the_table_lacks(monkeypatch):
    cov = _cov()
    monkeypatch.setattr(ct, "brand_new_op", lambda x: x, raising=False)
    assert any("brand_new_op" in p for p in cov.problems())


def test_only_mma_scaled_remains_an_unsupported_device_op():
    cov = _cov()
    unsupported = [n for n in cov.public_names()
                   if cov.kind(n) == "op" and support.SUPPORT[n][0] == support.UNSUP]
    assert unsupported == ["mma_scaled"]
    # the 29 ops issue 19 found unsupported are now implemented (or host-side)
    for n in ("atan2", "atomic_add", "atomic_cas", "cumsum", "cumprod", "divmod", "extract",
              "gather", "insert", "load_advanced_indexing", "pack_to_bytes", "reduce", "scan",
              "scatter", "store_advanced_indexing", "unpack_from_bytes",
              "grid_dependency_control_wait", "static_exception"):
        assert not getattr(getattr(FAKE_CT, n), "__qualname__", "").startswith("_unsupported"), n
