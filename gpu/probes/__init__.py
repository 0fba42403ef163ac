"""Probe kernels: tiny cuTile kernels that exercise one inexact op on crafted inputs, so the
GPU's arithmetic can be recorded and the simulator's numeric model fitted to it."""
