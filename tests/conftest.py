"""Shared test set-up: hypothesis profiles, GPU skipping, seeded random inputs."""
from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

# No per-example deadline: the first example of a numba-backed test compiles.
settings.register_profile("ci", deadline=None, max_examples=50,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, max_examples=10)
settings.register_profile("thorough", deadline=None, max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _has_cuda_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 -- a broken driver means "no usable GPU"
        return False


def pytest_collection_modifyitems(config, items):
    if not any("gpu" in item.keywords for item in items) or _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def rng(request) -> np.random.Generator:
    """A generator seeded from the test's id: fresh, non-zero data, reproducible per test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture
def cpu_launch(monkeypatch):
    """cuTile's launch runs the kernel in the CPU simulator on the tensors' memory, and
    the device queries answer as an H100 would: the API's own code path, on the CPU."""
    import contextlib

    import cuda.tile as ct
    import torch
    from spak import sim
    import spak.gpu.launch as gl
    import spak.kvcache as kvc

    def launch(stream, grid, kernel, args):
        sim.launch(kernel, grid, [sim.SimArray(a.numpy()) if isinstance(a, torch.Tensor)
                                  else a for a in args])
    monkeypatch.setattr(ct, "launch", launch)
    monkeypatch.setattr(gl, "current_raw_stream", lambda *a: 0)
    monkeypatch.setattr(gl, "current_device", lambda: None)      # a CPU tensor's index
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "device", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(kvc, "_num_sms", lambda *a: 132)
    monkeypatch.setattr(kvc, "_check_devices", lambda *a: None)
    import spak.varlen as vl
    real = vl.validate_varlen
    monkeypatch.setattr(vl, "validate_varlen", lambda *a, **kw: real(*a, **kw,
                                                                       require_cuda=False))


def pytest_terminal_summary(terminalreporter):
    """Skipped tests counted by reason, every run (CI included): a new skip, e.g. a tool
    that stopped installing, shows as a new line here instead of hiding in the dots."""
    reasons: dict[str, int] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    terminalreporter.section(f"skipped tests by reason ({sum(reasons.values())} in all)")
    for reason, n in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
        terminalreporter.write_line(f"{n:6d}  {reason}")
    if not reasons:
        terminalreporter.write_line("     0  (none skipped)")


@pytest.fixture(autouse=True)
def _fresh_store_version():
    """spak.api looks at the tuned-config store at most once a second (issue 34's host
    path); a test that points SPAK_TUNED_CONFIGS elsewhere must be seen at once."""
    import sys
    api = sys.modules.get("spak.api")
    if api is not None:
        api._STORE_SEEN[0] = float("-inf")
    yield
    if api is not None:
        api._STORE_SEEN[0] = float("-inf")
