"""The machine a plan runs on: its software, its GPU (or the GPU that recorded the result
files a plan is judged on), for the report's header and the GPU loop's choice of arch."""
from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

from spak.results.jsonl import read_results
from spak.results.provenance import git_commit, package_version
from spak.results.rows import ResultRow

__all__ = ["machine_info", "detect_gpu", "recorded_gpu_info", "read_result_files",
           "rel_path"]


def machine_info() -> dict:
    """Host, platform, core count, the versions that matter and the commit that runs."""
    commit, dirty = git_commit()
    short = commit if commit is None or os.environ.get("SPAK_COMMIT") else commit[:7]
    return {"host": socket.gethostname(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "numpy": package_version("numpy"), "numba": package_version("numba"),
            "cuda_tile": package_version("cuda-tile"),
            "tileiras": package_version("nvidia-cuda-tileiras"),
            "torch": package_version("torch"), "commit": short, "dirty": bool(dirty)}


def detect_gpu() -> dict:
    """{"present", "name", "arch", "profile" (key or None), "reason"} of torch's CUDA GPU."""
    try:
        import torch
    except ImportError as e:
        return {"present": False, "reason": f"PyTorch is not installed ({e})"}
    try:
        ok = torch.cuda.is_available()
    except Exception as e:  # noqa: BLE001
        return {"present": False, "reason": f"torch.cuda.is_available() raised {e!r}"}
    if not ok:
        return {"present": False, "reason": "no CUDA GPU (torch.cuda.is_available() is False)"}
    from spak.device.archs import arch_for_capability, lookup
    name = torch.cuda.get_device_name()
    cap = torch.cuda.get_device_capability()
    prof = lookup(name, cap)
    return {"present": True, "name": name, "arch": arch_for_capability(cap),
            "capability": list(cap), "profile": prof.key if prof else None, "reason": None}


def rel_path(path) -> str:
    """`path` relative to the working directory when it lies below it (stable in reports)."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def read_result_files(paths) -> list[dict]:
    """Every row of the files (a .gz name is read through gzip); a torn line is skipped."""
    for p in paths:
        if not Path(p).is_file():            # a missing file is the caller's error
            raise FileNotFoundError(f"no such results file: {p}")
    return [r for p in paths for r in read_results(p)]


def recorded_gpu_info(rows: list[dict], files) -> dict:
    """The GPU that recorded `rows` (their "gpu"/"arch" fields), as detect_gpu() reports."""
    from spak.device.archs import lookup
    gpus = {(r.gpu, r.arch) for r in map(ResultRow, rows) if r.gpu and r.arch}
    if len(gpus) != 1:
        return {"present": False, "reason": f"the recorded results name {len(gpus)} GPUs "
                                            f"({sorted(map(str, gpus))}); give one GPU's files"}
    name, arch = gpus.pop()
    prof = lookup(name)
    return {"present": True, "name": name, "arch": arch, "profile": prof.key if prof else None,
            "recorded": [rel_path(f) for f in files], "reason": None}
