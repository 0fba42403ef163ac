"""Installed names: the repository's sim/ and gpu/ install as spak.sim and spak.gpu.

pyproject.toml lists its packages explicitly (automatic discovery cannot see through a
package-dir mapping), so a new folder with an __init__.py must be added there; this test
fails when one is missing, and when anything would install under a bare top-level name.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

tomllib = pytest.importorskip("tomllib") if sys.version_info >= (3, 11) else pytest.importorskip("tomli")


def _config():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _on_disk() -> set[str]:
    """Every package the repository holds, under its installed name."""
    out = set()
    for top, installed in (("spak", "spak"), ("sim", "spak.sim"), ("gpu", "spak.gpu")):
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top).parts
            out.add(".".join((installed, *rel)))
    return out


def test_every_package_is_listed():
    listed = set(_config()["packages"])
    assert _on_disk() - listed == set(), "add these to [tool.setuptools] packages"
    assert listed - _on_disk() == set(), "listed but not on disk"


def test_nothing_installs_under_a_bare_name():
    cfg = _config()
    assert all(p == "spak" or p.startswith("spak.") for p in cfg["packages"])
    assert cfg["package-dir"] == {"spak": "spak", "spak.sim": "sim", "spak.gpu": "gpu"}


def test_simulator_and_kernels_import_under_spak():
    import spak.gpu.plan
    import spak.sim
    assert Path(spak.sim.__file__).parent == ROOT / "sim"
    assert Path(spak.gpu.plan.__file__).parent == ROOT / "gpu"
