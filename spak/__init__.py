"""SPAK: a simulate-then-run framework for GPU tile kernels, fused attention first.

The same cuTile kernel runs on the CPU simulator (`sim/`) and on the GPU
(`gpu/`); `spak` turns problem specs into runs, checks them against float64
references and reports. Importing `spak` stays cheap (no torch, no cuTile):
submodules load what they need when used.
"""
__version__ = "0.1.0"


def __getattr__(name):
    # spak.fmha loads torch (and registers torch.ops.spak.fmha) only when first used,
    # so `import spak` works on machines without torch.
    if name == "fmha":
        from spak.api import fmha
        globals()["fmha"] = fmha        # later lookups skip this hook (~1 us per call)
        return fmha
    raise AttributeError(f"module 'spak' has no attribute {name!r}")
