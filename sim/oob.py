"""Out-of-bounds tile accesses: cuTile's semantics by default, a finding for each, strict on request.

cuTile (cuda/tile/_stub.py, ct.load/ct.store): a tile that extends partly beyond the array
is padded on load (padding_mode) and its outside elements are ignored on store; a tile that
lies *entirely* outside, or partly outside with check_bounds=False, is "undefined behavior".
On an H100 such loads give padding and such stores are dropped (TileGym programs whose blocks
step past the end pass their checks there), so by default the simulator does the same -- the
movers pad/drop element by element -- and records the access as a finding: kept on the
launch's report (LaunchReport.oob), counted per kernel line for the process, and summarised
at exit in interpreter mode. SPAK_SIM_STRICT=1 (or set_strict(True)) raises SimulationError
at the op instead, as the simulator always did before. The same log holds the other
findings that run as declared but warn of the GPU: unwritten outputs (sim.interpret) and
spin-waits on an acquire ct.load (sim.memory._note_acquire_poll: a hang on an H200).
"""
from __future__ import annotations

import contextlib
import os
import sys
import threading

_lock = threading.Lock()
_state = {"strict": None, "exit_hook": False}
_log: list[str] = []            # every distinct finding, first-seen order
_counts: dict[str, int] = {}    # finding key (op, line, array, where) -> accesses
_taps: list[list] = []          # lists that see every record() call (sim.launch_memo)


def strict() -> bool:
    """True when out-of-bounds accesses raise (set_strict, else SPAK_SIM_STRICT=1)."""
    if _state["strict"] is not None:
        return _state["strict"]
    return os.environ.get("SPAK_SIM_STRICT", "") not in ("", "0")


def set_strict(on: bool | None) -> bool | None:
    """Force strict mode on/off (None: follow SPAK_SIM_STRICT again); returns the old value."""
    old, _state["strict"] = _state["strict"], on
    return old


def record(key: str, message: str, n: int = 1) -> None:
    """Note `n` accesses of one kind (key: op, kernel line, array, where; message: first one)."""
    with _lock:
        if key not in _counts:
            _counts[key] = 0
            _log.append(message)
        _counts[key] += n
        for t in _taps:
            t.append((key, message, n))


@contextlib.contextmanager
def tap():
    """Collect the (key, message, n) of every record() made inside the block (a launch's
    findings, for the launch memo to record again on a hit)."""
    calls: list = []
    with _lock:
        _taps.append(calls)
    try:
        yield calls
    finally:
        with _lock:
            _taps.remove(calls)


def mark() -> int:
    return len(_log)


def since(mark_: int) -> list[str]:
    """Findings first seen after mark() (a launch's own)."""
    with _lock:
        return list(_log[mark_:])


def total() -> int:
    return sum(_counts.values())


def summary() -> str:
    if not _log:
        return ""
    lines = [f"spak sim: {len(_log)} kind(s) of out-of-bounds tile access, unwritten output or "
             "spin-wait on a plain load, "
             f"{total()} in all (out of bounds: undefined in cuTile, run as the GPU does: loads "
             "padded, stores dropped; SPAK_SIM_STRICT=1 raises instead):"]
    keys = list(_counts)
    for k, msg in zip(keys, _log):
        lines.append(f"  {_counts[k]:>6}x {msg}")
    return "\n".join(lines)


def reset() -> None:
    with _lock:
        _log.clear()
        _counts.clear()


def install_exit_summary() -> None:
    """Print summary() to stderr when the process exits (interpreter mode)."""
    if _state["exit_hook"]:
        return
    import atexit
    _state["exit_hook"] = True
    atexit.register(lambda: summary() and print(summary(), file=sys.stderr))
