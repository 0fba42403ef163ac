"""Diagnose the cuTile compiler set-up, and explain cuTile's compile failures.

cuTile compiles each kernel with ``tileiras`` (the nvidia-cuda-tileiras wheel, or a CUDA
toolkit's). When that goes wrong it mostly says only "failed to compile Tile IR program".
The usual causes, each checked here with the fix:

* ``tileiras-missing``     no tileiras anywhere cuTile looks (the wheel, PATH, $CUDA_HOME/bin).
* ``wheel-mismatch``       nvidia-cuda-tileiras / nvidia-cuda-nvcc / nvidia-nvvm at different
                           versions (or one missing): cuTile then IGNORES the wheel and falls
                           back to whatever tileiras is on PATH, often an older one.
* ``tileiras-version``     the tileiras cuTile will run is not the pinned version.
* ``cuda-home-old``        CUDA_HOME / CUDA_PATH points at an older toolkit while tileiras
                           comes from PATH or that toolkit: tileiras then picks that toolkit's
                           ptxas / libnvvm and fails with the bare message.
* ``ptxas-old``            the ptxas on PATH (beside a PATH tileiras) is older than tileiras.
* ``arch-unsupported``     the GPU's compute capability is not one tileiras can target.

`diagnose()` returns a list of `Problem`s (empty: all good); every probe of the machine is a
parameter, so tests feed it fake environments. `explain(exc)` wraps a cuTile compile error
with the diagnosis (`CompilerSetupError`). `python -m spak.device.env` prints the report.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Mapping, Optional

__all__ = ["PINNED", "WHEELS", "SUPPORTED_ARCHS", "TUNED_ARCHS", "Problem", "CompilerSetupError",
           "wheel_versions", "find_tileiras", "tool_version", "toolkit_version", "diagnose",
           "format_problems", "is_compile_error", "explain", "report", "main"]

#: The toolchain pyproject's [gpu] extra pins (one matching version).
PINNED = {"cuda-tile": "1.7.0", "nvidia-cuda-tileiras": "13.4.92",
          "nvidia-cuda-nvcc": "13.4.92", "nvidia-nvvm": "13.4.92"}
WHEELS = ("nvidia-cuda-tileiras", "nvidia-cuda-nvcc", "nvidia-nvvm")
#: tileiras 13.4 --gpu-name values (gpu.compile.TILEIRAS_ARCHS; copied to stay import-free).
SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_88", "sm_89", "sm_90", "sm_100", "sm_103",
                   "sm_107", "sm_110", "sm_120", "sm_121")
TUNED_ARCHS = ("sm_90", "sm_120")
_INSTALL = 'pip install -e ".[gpu]"   (or: pip install ' + " ".join(
    f"{k}=={v}" for k, v in PINNED.items()) + ")"


@dataclasses.dataclass(frozen=True)
class Problem:
    code: str        # one of the codes in the module docstring
    message: str     # what is wrong, with the facts found
    fix: str         # what to do

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}\n    fix: {self.fix}"


class CompilerSetupError(RuntimeError):
    """A cuTile compile failure, with the set-up diagnosis attached (``.problems``)."""

    def __init__(self, message: str, problems=(), original: Optional[BaseException] = None):
        super().__init__(message)
        self.problems = list(problems)
        self.original = original


# ------------------------------------------------------------------ probes

def wheel_versions() -> dict[str, Optional[str]]:
    """Installed versions of cuda-tile and the three compiler wheels (None: not installed)."""
    from importlib import metadata
    out = {}
    for name in PINNED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def _wheel_tileiras() -> Optional[str]:
    try:
        import nvidia.cu13 as cu13
        root = list(cu13.__path__)[0]
    except (ImportError, AttributeError, IndexError):
        return None
    return shutil.which("tileiras", path=os.path.join(root, "bin"))


def _major_minor(v: Optional[str]) -> Optional[tuple[int, int]]:
    m = re.match(r"\s*(\d+)\.(\d+)", v or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def find_tileiras(versions: Mapping[str, Optional[str]], env: Mapping[str, str],
                  wheel_tileiras: Optional[str],
                  which: Callable[..., Optional[str]] = shutil.which) -> tuple[Optional[str], str]:
    """(path, source) of the tileiras cuTile 1.7 will run, in cuTile's own search order.

    source: "wheel", "PATH", "CUDA_HOME" or "none". The wheel counts only when the three
    compiler wheels share one major.minor (cuTile's rule).
    """
    mm = {_major_minor(versions.get(w)) for w in WHEELS}
    if wheel_tileiras and None not in mm and len(mm) == 1:
        return wheel_tileiras, "wheel"
    p = which("tileiras", path=env.get("PATH", ""))
    if p:
        return p, "PATH"
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        p = which("tileiras", path=os.path.join(home, "bin"))
        if p:
            return p, "CUDA_HOME"
    return None, "none"


def tool_version(path: Optional[str]) -> Optional[str]:
    """'13.4.92' from `<tool> --version` ("... release 13.4, V13.4.92"), or None."""
    if not path:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"V(\d+\.\d+\.\d+)", out.stdout + out.stderr) or \
        re.search(r"release (\d+\.\d+)", out.stdout + out.stderr)
    return m.group(1) if m else None


def toolkit_version(home: Optional[str]) -> Optional[str]:
    """A CUDA toolkit's version from version.json, version.txt or bin/nvcc; None if unknown."""
    if not home:
        return None
    h = Path(home)
    try:
        doc = json.loads((h / "version.json").read_text())
        v = doc.get("cuda", {}).get("version")
        if v:
            return str(v)
    except (OSError, ValueError, AttributeError):
        pass
    try:
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", (h / "version.txt").read_text())
        if m:
            return m.group(1)
    except OSError:
        pass
    nvcc = h / "bin" / "nvcc"
    return tool_version(str(nvcc)) if nvcc.exists() else None


# ------------------------------------------------------------------ diagnosis

def diagnose(*, arch: Optional[str] = None,
             versions: Optional[Mapping[str, Optional[str]]] = None,
             env: Optional[Mapping[str, str]] = None,
             wheel_tileiras: Optional[str] = "auto",
             which: Callable[..., Optional[str]] = shutil.which,
             version_of: Callable[[Optional[str]], Optional[str]] = tool_version,
             toolkit_version_of: Callable[[Optional[str]], Optional[str]] = toolkit_version,
             ) -> list[Problem]:
    """Everything wrong with the cuTile compiler set-up for ``arch`` ("sm_90", or None to
    skip the arch check). Each probe can be replaced (tests pass fakes)."""
    versions = wheel_versions() if versions is None else versions
    env = os.environ if env is None else env
    wt = _wheel_tileiras() if wheel_tileiras == "auto" else wheel_tileiras
    present = {w: versions.get(w) for w in WHEELS if versions.get(w)}
    path, source = find_tileiras(versions, env, wt, which)
    tv = None if path is None else version_of(path)
    return [*_check_wheels(versions, present),
            *_check_tileiras(path, source, tv, versions, present),
            *_check_cuda_home(env, source, tv, toolkit_version_of),
            *_check_ptxas(path, source, tv, env, which, version_of),
            *_check_arch(arch)]


def _check_wheels(versions, present) -> list[Problem]:
    """The three compiler wheels: all or none, one version."""
    if not present:
        return []
    mm = {_major_minor(v) for v in present.values()}
    if len(present) == len(WHEELS) and len(mm) == 1 and len(set(present.values())) == 1:
        return []
    listed = ", ".join(f"{w} {versions.get(w) or 'missing'}" for w in WHEELS)
    return [Problem(
        "wheel-mismatch",
        f"the cuTile compiler wheels do not match ({listed}); cuTile then ignores the "
        f"wheel's tileiras and falls back to one on PATH or in $CUDA_HOME, if any",
        "install all three at one version: pip install " + " ".join(
            f"{w}=={PINNED[w]}" for w in WHEELS))]


def _check_tileiras(path, source, tv, versions, present) -> list[Problem]:
    """The tileiras cuTile will run: found, runnable, the pinned version, matching nvcc."""
    if path is None:
        return [Problem(
            "tileiras-missing",
            "no tileiras compiler found (not from the nvidia-cuda-tileiras wheel, not on "
            "PATH, not in $CUDA_HOME/bin); cuTile cannot compile any kernel",
            _INSTALL)]
    want = PINNED["nvidia-cuda-tileiras"]
    if tv is None:
        return [Problem(
            "tileiras-version",
            f"tileiras at {path} (from {source}) did not report a version; it may not run "
            f"on this machine (missing libraries, wrong CPU architecture)",
            f"run `{path} --version` to see why; or {_INSTALL}")]
    if _major_minor(tv) != _major_minor(want):
        return [Problem(
            "tileiras-version",
            f"cuTile will run tileiras {tv} at {path} (from {source}), but SPAK is pinned "
            f"to {want}" + (" (the wheel was skipped: see wheel-mismatch)"
                            if source != "wheel" and present else ""),
            _INSTALL + "; and make sure no older tileiras comes first on PATH")]
    if present and tv != versions.get("nvidia-cuda-nvcc") and source != "wheel":
        return [Problem(
            "tileiras-version",
            f"tileiras {tv} (from {source}) differs from nvidia-cuda-nvcc "
            f"{versions.get('nvidia-cuda-nvcc')} / nvidia-nvvm {versions.get('nvidia-nvvm')}",
            "install the three compiler wheels at one version: " + _INSTALL)]
    return []


def _check_cuda_home(env, source, tv, toolkit_version_of) -> list[Problem]:
    """An older toolkit through CUDA_HOME / CUDA_PATH (matters unless the wheel is used:
    cuTile strips CUDA_HOME only when it runs the wheel's tileiras)."""
    problems = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        home = env.get(var)
        if not home:
            continue
        kv = toolkit_version_of(home)
        ref = tv or PINNED["nvidia-cuda-tileiras"]
        if source != "wheel" and kv is not None and _major_minor(kv) < _major_minor(ref):
            problems.append(Problem(
                "cuda-home-old",
                f"{var}={home} is CUDA {kv}, older than tileiras {ref}: tileiras then uses that "
                f"toolkit's ptxas/libnvvm and fails with a bare 'failed to compile Tile IR "
                f"program'",
                f"unset {var} (the wheel brings its own ptxas/libnvvm), or point it at a CUDA "
                f"{'.'.join(map(str, _major_minor(ref)))}+ toolkit"))
        elif source != "wheel" and kv is None and not Path(home).exists():
            problems.append(Problem(
                "cuda-home-old",
                f"{var}={home} does not exist, yet tileiras (from {source}) is given it",
                f"unset {var} or point it at a CUDA {ref}+ toolkit"))
    return problems


def _check_ptxas(path, source, tv, env, which, version_of) -> list[Problem]:
    """The ptxas beside a tileiras found on PATH."""
    if path is None or source == "wheel" or not tv:
        return []
    ptxas = which("ptxas", path=env.get("PATH", ""))
    pv = version_of(ptxas) if ptxas else None
    if not (pv and _major_minor(pv) < _major_minor(tv)):
        return []
    return [Problem(
        "ptxas-old",
        f"ptxas {pv} at {ptxas} is older than tileiras {tv}; tileiras runs the first "
        f"ptxas on PATH",
        f"put a {tv} ptxas first on PATH (e.g. the nvidia-cuda-nvcc=={tv} wheel's), "
        f"or {_INSTALL}")]


def _check_arch(arch) -> list[Problem]:
    """The GPU's arch, against what tileiras 13.4 can target."""
    if arch is None or arch in SUPPORTED_ARCHS:
        return []
    return [Problem(
        "arch-unsupported",
        f"this GPU is {arch}; tileiras 13.4 targets only {', '.join(SUPPORTED_ARCHS)} "
        f"(Ampere sm_80 and newer)",
        "run on an Ampere or newer GPU (SPAK is tuned for sm_90 H100/H200 and sm_120); "
        "the CPU simulator (`spak sim`) needs no GPU")]


def format_problems(problems) -> str:
    if not problems:
        return "cuTile compiler set-up: OK"
    return "cuTile compiler set-up problems:\n" + "\n".join(f"  {p}" for p in problems)


def is_compile_error(exc: BaseException) -> bool:
    """True for cuTile's compiler failures (tileiras missing, exited non-zero, timed out)."""
    try:
        from cuda.tile._exception import TileCompilerError
        if isinstance(exc, TileCompilerError):
            return True
    except ImportError:
        pass
    text = str(exc)
    return ("tileiras" in text and isinstance(exc, (FileNotFoundError, OSError))
            or "failed to compile Tile IR" in text)


def explain(exc: BaseException, *, arch: Optional[str] = None, **probes) -> CompilerSetupError:
    """A CompilerSetupError carrying cuTile's message and the set-up diagnosis."""
    try:
        problems = diagnose(arch=arch, **probes)
    except Exception as e:  # noqa: BLE001 -- the diagnosis must never hide the real error
        problems = [Problem("diagnosis-failed", f"{type(e).__name__}: {e}", "see cuTile's error")]
    head = f"cuTile failed to compile the kernel ({type(exc).__name__}: {str(exc).strip()})"
    if problems:
        body = format_problems(problems)
    else:
        body = ("cuTile compiler set-up: OK (tileiras, its wheels and CUDA_HOME look right); "
                "this is likely a kernel/compiler bug: report it with the message above")
    return CompilerSetupError(f"{head}\n{body}", problems, exc)


def report(arch: Optional[str] = None) -> str:
    """The human-readable report `python -m spak.device.env` prints."""
    v = wheel_versions()
    path, source = find_tileiras(v, os.environ, _wheel_tileiras())
    lines = ["wheels: " + ", ".join(f"{k} {v[k] or 'missing'}" for k in PINNED),
             f"tileiras: {path or 'not found'} (from {source}, version {tool_version(path)})",
             "CUDA_HOME=" + os.environ.get("CUDA_HOME", "(unset)") +
             "  CUDA_PATH=" + os.environ.get("CUDA_PATH", "(unset)")]
    if arch:
        lines.append(f"GPU arch: {arch}")
    lines.append(format_problems(diagnose(arch=arch)))
    return "\n".join(lines)


def local_arch() -> Optional[str]:
    """'sm_90' for the current CUDA device, or None without torch/CUDA."""
    try:
        import torch
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001
        return None


def main(argv=None) -> int:
    print(report(local_arch()))
    return 1 if diagnose(arch=local_arch()) else 0


if __name__ == "__main__":
    sys.exit(main())
