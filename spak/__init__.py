"""SPAK: a simulate-then-run framework for GPU tile kernels, fused attention first.

The same cuTile kernel runs on the CPU simulator (`sim/`) and on the GPU
(`gpu/`); `spak` turns problem specs into runs, checks them against float64
references and reports. Importing `spak` stays cheap (no torch, no cuTile):
submodules load what they need when used.
"""
import os as _os

__version__ = "0.1.0"

# The simulator (sim/) and the kernels (gpu/) live beside spak/ in the repository and
# install as spak.sim and spak.gpu (pyproject.toml's package-dir). A source tree used
# without installing it (a copy on a GPU machine, `python -m spak` from the root) has
# no spak/sim: adding the repository root to this package's path makes the same names
# resolve there. An installed wheel has spak/sim itself and no sibling sim/.
_root = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
if (not _os.path.isdir(_os.path.join(__path__[0], "sim"))
        and _os.path.isfile(_os.path.join(_root, "sim", "__init__.py"))
        and _os.path.isfile(_os.path.join(_root, "gpu", "__init__.py"))):
    __path__.append(_root)


def __getattr__(name):
    # spak.fmha loads torch (and registers torch.ops.spak.fmha) only when first used,
    # so `import spak` works on machines without torch.
    if name == "fmha":
        from spak.api import fmha
        globals()["fmha"] = fmha        # later lookups skip this hook (~1 us per call)
        return fmha
    if name == "fmha_kvcache":          # decode over a KV cache (spak/kvcache.py), same way
        from spak.kvcache import fmha_kvcache
        globals()["fmha_kvcache"] = fmha_kvcache
        return fmha_kvcache
    if name == "fmha_varlen":           # packed variable-length prefill (spak/varlen.py)
        from spak.varlen import fmha_varlen
        globals()["fmha_varlen"] = fmha_varlen
        return fmha_varlen
    raise AttributeError(f"module 'spak' has no attribute {name!r}")
