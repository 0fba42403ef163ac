"""spak's CPU simulator of cuTile tile kernels.

    from spak import sim
    report = sim.launch(kernel, grid, (q, k, v, out, scale, ...), model="sm_90")

`kernel` is a `@ct.kernel`; numpy array arguments are read and written in place (wrap
bf16 data as `sim.SimArray(float32_values, ct.bfloat16)`). The kernel's own Python body
runs for every block, with cuTile's ops implemented on numpy/numba under a named numeric
model (sim.numerics). The checker raises on out-of-bounds accesses, double writes by two
blocks and output elements no block wrote; messages name the block and the kernel line.

Kernels whose blocks talk through memory (atomics, spin locks) run in cooperative mode:
one thread per block, taking turns at atomics, with a happens-before race checker
(sim.coop, sim.races). `sim.find_races(kernel, grid, args, orders=N, seed=S)` runs a
launch in several block orders and reports races and outputs that differ.
`sim.enable()` (or SPAK_SIM=1, or `python -m spak.sim script.py`) makes cuTile's own
`ct.launch` run on the simulator with CPU tensors or numpy arrays (sim.interpret).
"""
from .errors import SimulationError, SimNotSupported, SimTypeError
from .launch import LaunchReport, launch
from .memory import SimArray
from .numerics import MODELS, NumericModel, get_model
from .races import RaceReport, find_races
from .interpret import disable, enable, enabled_by_environment, is_enabled

__all__ = ["launch", "LaunchReport", "SimArray", "SimulationError", "SimNotSupported",
           "SimTypeError", "MODELS", "NumericModel", "get_model", "find_races", "RaceReport",
           "enable", "disable", "is_enabled"]

if enabled_by_environment():      # SPAK_SIM=1: ct.launch runs on the simulator
    enable(interpreter_summary=True)
