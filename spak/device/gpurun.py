"""`spak run`: the GPU loop. Check, compare with the simulator, and time a kernel family's
kernels on the local GPU (the command line is spak.cli.run).

For every selected kernel and shape (spak.device.case, through the family):

* correctness vs a float64 reference (relative L2, max abs, NaN/Inf count; the family's
  gates) and vs a fast peer (PyTorch SDPA for attention: relative L2 between the two
  outputs). The FMHA forward's reference is spak.attention.reference.attention_f64 on
  the CPU for small problems, torch float64 on the GPU for big ones
  (spak.device.gpu_reference);
* agreement with the CPU simulator on the same inputs under the matching numeric model:
  fraction of output elements bit-identical and the largest difference in ulps, on a
  slice the family picks within --sim-work (attention: batch 0, the first query
  head(s) with their kv head, the LAST query rows aligned to TILE_M, all keys; the
  causal diagonal is kept exact). The row's "sim.slice" says which (spak.device.agreement);
* timing with CUDA events (spak.device.timing: the method `spak sweep` uses too),
  rotating among several input sets (so the L2 cache does not flatter small shapes;
  never zeros); TFLOPS from the family's FLOPs and percent of an fp16 8192^3
  torch.matmul ceiling measured in the same run; the peers (spak.device.peers: plug-ins
  for SDPA's backends, NVIDIA's sample, TileGym, FlashInfer, a same-size copy) timed on
  the same inputs (a peer that is missing or refuses a shape is a skipped row with a
  note). All providers of a shape are checked first, then timed in turns (forward,
  backward and shuffled order, --repeats turns, each provider's best turn), since
  whichever is timed first after a pause runs a few % fast; a row's "timing" says "in
  turns" or "alone". Each --timing mode (spak.device.timing.MODES: kernel, flush,
  eager) gives the row's "modes"[mode]; the first also its top-level ms_*.

Output: a table (or --json), and one JSON line per (shape, provider) appended to --out as
it finishes (fsync'd: a killed run keeps every finished row). Each row records the
family, the GPU, date, torch/cuTile/SPAK versions and the command.

torch and cuTile are imported inside the functions: `spak --help` works anywhere.
"""
from __future__ import annotations

import datetime as _dt
import shlex
from pathlib import Path
from typing import Callable, Optional

from spak import __version__
from spak.device.case import guarded_case, run_case
from spak.device.timing import matmul_ceiling
from spak.results.provenance import commit_label, slug

__all__ = ["RunEnv", "gpu_missing", "results_path", "ceiling_row", "run_problems",
           "save_dump", "run_passed", "SCHEMA"]

#: the rows' schema. Version 2 adds "family" (version-1 rows are all the FMHA forward's)
#: and, on timed rows, "batches" and "per_batch" (spak.device.timing).
SCHEMA = "spak.run/2"


class RunEnv:
    """Run-wide facts recorded on every row, and the --dump collection."""

    def __init__(self, argv):
        import torch
        import cuda.tile as ct
        self.device = "cuda"
        self.gpu = torch.cuda.get_device_name()
        major, minor = torch.cuda.get_device_capability()
        self.arch = f"sm_{major}{minor}"
        props = torch.cuda.get_device_properties(0)
        self.l2_bytes = int(getattr(props, "L2_cache_size", 50 << 20))
        self.dump: dict = {}            # --dump: disagreeing slices (agreement.dump_slice)
        self.base = {
            "schema": SCHEMA, "gpu": self.gpu, "arch": self.arch,
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "torch": torch.__version__, "cuda": torch.version.cuda,
            "cuda_tile": getattr(ct, "__version__", None), "spak": __version__,
            "commit": commit_label(), "command": "spak " + shlex.join(argv),
        }


def gpu_missing() -> Optional[str]:
    """Why `spak run` cannot run here (no torch, no CUDA GPU), or None."""
    try:
        import torch
    except ImportError as e:
        return f"needs PyTorch with CUDA ({e}); see README, GPU section"
    if not torch.cuda.is_available():
        return ("no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False); "
                "on a CPU-only machine use `spak sim`")
    return None


def results_path(out: str, env: RunEnv) -> Optional[Path]:
    """--out: None for "-", "auto" -> results/run-<gpu>-<date>.jsonl; parents created."""
    if out == "-":
        return None
    path = Path(out if out != "auto" else
                f"results/run-{(slug(env.gpu) or 'gpu')}-{env.base['date'][:10]}.jsonl")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def ceiling_row(env: RunEnv) -> dict:
    """The fp16 matmul ceiling as a row (provider "matmul-fp16-8192"; "tflops")."""
    return {**env.base, "provider": "matmul-fp16-8192", "case": "matmul 8192^3 fp16",
            **matmul_ceiling()}


def run_problems(fam, problems, kernels, args, env: RunEnv, emit: Callable[[dict], None],
                 ceiling: Optional[float], show: Callable[[list], None]) -> None:
    """Every problem's rows (spak.device.case.run_case), each shape guarded: a failure is
    rows, not the end. emit(row) as each row finishes; show(rows) after each shape."""
    for spec in problems:
        rows = guarded_case(spec, kernels,
                            lambda em: run_case(spec, kernels, args, env, ceiling, em, fam),
                            emit, env.base, fam)
        show(rows)


def save_dump(path: str, dump: dict) -> str:
    """Write --dump's slices to an .npz; returns the line that says what it holds."""
    import numpy as np
    kept = {k: v for k, v in dump.items() if not k.startswith("_")}
    np.savez_compressed(path, **kept)
    return (f"dump: {len(kept) and sum(k.endswith('/meta') for k in kept)} disagreeing "
            f"slice(s) -> {path}" + (f" ({dump['_skipped']} over the size cap left out)"
                                     if dump.get("_skipped") else ""))


def run_passed(rows: list[dict]) -> bool:
    """Every (not skipped) row of our kernels passed."""
    ours = [r for r in rows if r.get("provider", "").startswith("spak-")
            and not r.get("skipped")]
    return all(r.get("passed") for r in ours)
