"""Agreement of the GPU with the CPU simulator: the simulator re-computes a slice of the
problem on the very inputs the GPU used, under the GPU's numeric model, and the outputs
are compared bit for bit (fraction of elements bit-identical, largest distance in ulps).

The simulator is slow on big shapes, so the family picks the slice (its ``sim_slice``)
within a work budget (for attention: spak.device.attention.attention_slice). Slices that do
not agree can be kept (--dump) for offline replay with tools/agree_replay.py.
"""
from __future__ import annotations

import json
import time

__all__ = ["DEFAULT_SIM_WORK", "DUMP_MAX_BYTES", "agreement", "dump_slice", "sim_model"]

#: simulated Sq_slice * Sk * D * heads per case (~1 s)
DEFAULT_SIM_WORK = 1 << 29
#: --dump: disagreeing slices kept, in bytes at most (small enough to bring home)
DUMP_MAX_BYTES = 15 * 2 ** 20


def sim_model(arch: str) -> str:
    """The simulator's numeric model for a GPU arch (sm_90 when it has none of its own)."""
    try:
        from spak import sim
        return arch if arch in sim.MODELS else "sm_90"
    except ImportError:
        return "sm_90"


def agreement(fam, kernel: str, problem, inputs, outputs, config, *, model: str,
              heads: int = 1, work: int = DEFAULT_SIM_WORK, dump=None) -> dict:
    """Simulate the family's slice of ``problem`` and compare it with the GPU's
    ``outputs`` (computed from ``inputs`` with ``config``) bit for bit.

    Returns fraction_bit_identical and elements (over all outputs), max_ulp, slice (its
    text), model and seconds (simulation). dump: a dict collecting the slices that are
    not bit-identical (`dump_slice`). A family may cut several slices (a list: each
    simulated, its ``gpu`` outputs compared; the texts joined by "; ")."""
    import numpy as np
    from spak.core.metrics import fraction_bit_identical, max_ulp
    cut = fam.sim_slice(kernel, problem, inputs, outputs, config, heads=heads, work=work)
    slices = list(cut) if isinstance(cut, (list, tuple)) else [cut]
    same = elements = worst = 0
    secs = 0.0
    for sl in slices:
        t0 = time.perf_counter()
        sim_out, _ = fam.simulate(kernel, sl.problem, sl.inputs, tiles=sl.tiles, model=model)
        secs += time.perf_counter() - t0
        sl_same = sl_elements = 0
        for name, gpu in sl.gpu.items():
            n = int(np.size(gpu))
            sl_same += fraction_bit_identical(gpu, sim_out[name], problem.dtype) * n
            sl_elements += n
            worst = max(worst, max_ulp(gpu, sim_out[name], problem.dtype))
        if dump is not None and sl_same < sl_elements:
            dump_slice(dump, f"{kernel}|{problem.case_id}", sl.dump_arrays, sl.dump_meta)
        same, elements = same + sl_same, elements + sl_elements
    frac = same / elements if elements else 1.0
    return {"fraction_bit_identical": frac, "max_ulp": worst, "elements": elements,
            "slice": "; ".join(sl.text for sl in slices), "model": model, "seconds": secs}


def dump_slice(dump: dict, key: str, arrays: dict, meta: dict) -> None:
    """Keep one disagreeing slice (all it takes to re-simulate it) while under the cap:
    arrays under "NNN/name", the facts (``{"case": key, **meta}``) as JSON under
    "NNN/meta"; "_bytes" and "_skipped" count what is kept and what is left out."""
    import numpy as np
    arrays = {k: a for k, a in arrays.items() if a is not None}
    size = sum(a.nbytes for a in arrays.values())
    if dump.get("_bytes", 0) + size > DUMP_MAX_BYTES:
        dump["_skipped"] = dump.get("_skipped", 0) + 1
        return
    dump["_bytes"] = dump.get("_bytes", 0) + size
    n = sum(1 for x in dump if x.endswith("/meta"))
    for name, arr in arrays.items():
        dump[f"{n:03d}/{name}"] = arr
    dump[f"{n:03d}/meta"] = np.frombuffer(json.dumps({"case": key, **meta}).encode(), np.uint8)
