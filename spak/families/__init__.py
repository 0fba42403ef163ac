"""Kernel families: one module per family, each exposing ``FAMILY`` (a KernelFamily).

    from spak import families
    fam = families.get("fmha_fwd")          # or families.get() for the default
    for problem in fam.select(["default"]):
        row = fam.sim_case(fam.kernels[0], problem)

A new family is a module here plus its kernels (gpu/kernels/), planner (gpu/) and tests,
and one line in ``MODULES``. Family modules import cheaply (no torch, no cuTile, no
simulator at import time), so `spak --help` lists them on any machine.
"""
from __future__ import annotations

import importlib

from spak.families.base import KernelFamily

__all__ = ["KernelFamily", "DEFAULT", "MODULES", "names", "get"]

#: family name -> module defining FAMILY, in the order `--family` lists them
MODULES: dict[str, str] = {
    "fmha_fwd": "spak.families.fmha_fwd",
    "fmha_bwd": "spak.families.fmha_bwd",
    "fmha_decode": "spak.families.fmha_decode",
}
DEFAULT = "fmha_fwd"


def names() -> tuple[str, ...]:
    return tuple(MODULES)


def get(name: str | None = None) -> KernelFamily:
    """The family called `name` (default: the FMHA forward); ValueError names the choices."""
    name = DEFAULT if name is None else name
    if name not in MODULES:
        raise ValueError(f"unknown kernel family {name!r}; choose one of {', '.join(MODULES)}")
    fam = importlib.import_module(MODULES[name]).FAMILY
    assert fam.name == name, (fam.name, name)
    return fam
