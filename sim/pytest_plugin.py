"""pytest plugin: a cuTile project's test suite, unchanged, on the CPU simulator.

    python -m pytest -p spak.sim.pytest_plugin tests/      # or
    python -m spak.sim -m pytest tests/

Loaded with -p, this module switches interpreter mode on as pytest starts, before any
conftest is imported (a conftest may ask `torch.cuda.get_device_capability('cuda')` while
it registers options): `ct.launch` runs kernels on the simulator, `torch.cuda` presents the
simulated GPU, "cuda" tensors live on the CPU (sim.cuda_as_cpu) and `tensor.is_cuda` answers
True. Environment: SPAK_SIM_MODEL (sm_90 default, sm_120, sm_89) picks the GPU simulated;
SPAK_SIM_CUDA_AS_CPU=0 / SPAK_SIM_IS_CUDA=0 switch those parts off; SPAK_SIM_STRICT=1 makes
out-of-bounds tiles raise; SPAK_SIM_PADDING=poison fills UNDETERMINED padding with NaN /
int max (default here: zeros, what an H100 gave); SPAK_SIM_TEST_TIMEOUT=S fails a test that runs longer than S
seconds (the simulator is ~10^3-10^5x slower than a GPU: a bound for CI, where
pytest-timeout may be missing). The out-of-bounds findings (sim.oob) are summarised at the end.
"""
from __future__ import annotations

import os
import signal
import threading

import pytest

from . import interpret, launch_memo, oob


def _on(name: str) -> bool:
    return os.environ.get(name, "1") not in ("", "0")


def _enable():
    interpret.enable(model=os.environ.get("SPAK_SIM_MODEL", "sm_90"),
                     cuda_as_cpu=_on("SPAK_SIM_CUDA_AS_CPU"),
                     tensor_is_cuda=_on("SPAK_SIM_IS_CUDA"), interpreter_summary=False,
                     undetermined_padding=os.environ.get("SPAK_SIM_PADDING") or "zero")


_enable()       # at import (-p loads plugins before conftests), not in a hook


def pytest_report_header(config):
    model = os.environ.get("SPAK_SIM_MODEL", "sm_90")
    return (f"spak sim: ct.launch runs on the CPU simulator ({model}); torch.cuda is "
            f"simulated: {interpret.is_enabled()}; strict out-of-bounds: {oob.strict()}")


def pytest_terminal_summary(terminalreporter):
    st = interpret.stats
    terminalreporter.write_line(f"spak sim: {st['launches']} kernel launch(es) simulated in "
                                f"{st['seconds']:.1f} s; {launch_memo.summary()}")
    text = oob.summary()
    if text:
        terminalreporter.write_sep("=", "spak sim: out-of-bounds tile accesses")
        terminalreporter.write_line(text)


class SimTestTimeout(Exception):
    """A test ran past SPAK_SIM_TEST_TIMEOUT seconds on the simulator."""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    limit = float(os.environ.get("SPAK_SIM_TEST_TIMEOUT", "0") or 0)
    if limit <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise SimTestTimeout(f"spak sim: test ran past SPAK_SIM_TEST_TIMEOUT={limit:g} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
