"""NVIDIA's binary tools the SASS and cubin cross-checks run (nvdisasm, cuobjdump).

pip puts them in site-packages/nvidia/cu13/bin (wheels nvidia-cuda-nvdisasm and
nvidia-cuda-cuobjdump, in the `test` extra at the toolchain's version), not on PATH, so we
look there first. A developer without them gets a skip that says what to install; in CI
(the CI environment variable, set by the CI runner) a missing tool FAILS the test instead:
the package index provides it, so a skip there would hide a broken install step.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

#: the wheel holding each tool, at the version of tileiras/nvcc in pyproject.toml
WHEELS = {"nvdisasm": "nvidia-cuda-nvdisasm==13.4.92",
          "cuobjdump": "nvidia-cuda-cuobjdump==13.4.92"}


def find(name: str) -> str | None:
    """The tool's path: pip's nvidia/cu13/bin first, then PATH; None if neither has it."""
    try:
        import nvidia.cu13 as cu
        for base in cu.__path__:
            p = Path(base) / "bin" / name
            if p.exists():
                return str(p)
    except ImportError:
        pass
    return shutil.which(name)


def require(name: str) -> str:
    """find(name), or skip (developer machine) / fail (CI) naming the wheel to install."""
    path = find(name)
    if path is not None:
        return path
    msg = f"{name} not installed (pip install {WHEELS[name]})"
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(msg + ": CI must install it (pyproject.toml's `test` extra)")
    pytest.skip(msg)


def import_or_skip(module: str, install: str):
    """pytest.importorskip, except that in CI a missing module the package index provides
    FAILS (ci/cpu.sh installs it: `install` says how)."""
    import importlib
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        msg = f"{module} not installed ({install}): {exc}"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(msg + ": CI must install it", pytrace=False)
        pytest.skip(msg, allow_module_level=True)
