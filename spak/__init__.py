"""SPAK: a simulate-then-run framework for GPU tile kernels, fused attention first.

The same cuTile kernel runs on the CPU simulator (`sim/`) and on the GPU
(`gpu/`); `spak` turns problem specs into runs, checks them against float64
references and reports. Importing `spak` stays cheap (no torch, no cuTile):
submodules load what they need when used.
"""
__version__ = "0.1.0"
