"""`spak sweep`: the manual tile sweeper (recipe step 4).

For one kernel, a set of shapes and the search space of the local GPU's arch (the plan
file's ``[sweep.<arch>]``, or ``--space``), every config is compiled, checked against
PyTorch SDPA and timed; TFLOPS per config are printed with a progress bar and an ETA and
the best config per shape is marked. The default tiles and SDPA's cuDNN and flash backends
are timed once per shape as well (for the report and the "tuned >= default" check).

Isolation. The configs run in a long-lived worker subprocess (spak/sweep_worker.py); this
process only schedules, records and prints. A config that fails to compile, fails to
launch or gives a wrong result is recorded with its error by the worker; one that runs
past ``--timeout`` seconds, or that kills the worker, is recorded by this process (which
kills the worker's process group) and a fresh worker takes the remaining configs.

Results. One JSON line per (shape, provider, config), appended and fsync'd as each
finishes (schema "spak.tune.sweep/1", see RESULT_FIELDS). ``--resume`` skips what the file
already holds for this GPU, so a killed sweep loses at most the config in flight.
``--budget-s`` stops cleanly before the wall-clock budget runs out (exit status 3: resume
to finish).

Compile time. cuTile compiles one cubin per (config, dtype, head dim, causal, and the
launch's specialisation: which extents are multiples of 16) on its first launch, ~2-20 s
each on a CPU. ``--compile-jobs N`` helper processes compile the coming variants ahead of
the worker, in parallel, by launching each once on tiny arrays of the same specialisation
(the cubins land in cuTile's disk cache, where the worker's own first launch finds them).

    spak sweep --shapes standard                       # the plan's space for this GPU
    spak sweep --shapes 4x16x2048x128/causal --space TILE_M=64 TILE_N=64,128 occupancy=1,2
    spak sweep --out results/sweep.jsonl --resume --budget-s 540 --update-store
    spak sweep --shapes standard --list --arch sm_90   # the jobs and a time estimate, no GPU
"""
from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import json
import math
import os
import selectors
import shlex
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from spak import __version__
from spak.attention.problems import GRAMMAR_HELP, ProblemSpec, ShapeError, select_cases
from spak.results.jsonl import ResultsWriter, read_results, row_problem
from spak.results.provenance import git_commit, slug

__all__ = ["SCHEMA", "SPACE_KEYS", "FALLBACK_SPACES", "config_id", "parse_space_args",
           "load_space", "expand_space", "Job", "plan_jobs", "compile_unit",
           "SweepOptions", "Sweep", "estimate_seconds", "register",
           "cmd_sweep", "main", "provider_name"]

SCHEMA = "spak.tune.sweep/1"
SPACE_KEYS = ("TILE_M", "TILE_N", "occupancy", "num_ctas")
ROOT = Path(__file__).resolve().parents[2]
DEFAULT_PLAN = ROOT / "plans" / "fmha.toml"

#: Used only when the plan file has no [sweep.<arch>] (or cannot be read); same lists as
#: plans/fmha.toml had when this was written, kept small enough for one 10-minute run.
FALLBACK_SPACES = {
    "sm_90": {"TILE_M": [64, 128], "TILE_N": [64, 128], "occupancy": [1, 2], "num_ctas": [1]},
    "sm_100": {"TILE_M": [64, 128], "TILE_N": [64, 128], "occupancy": [1, 2], "num_ctas": [1]},
    "sm_120": {"TILE_M": [64, 128], "TILE_N": [32, 64], "occupancy": [1, 2], "num_ctas": [1]},
    "sm_89": {"TILE_M": [64, 128], "TILE_N": [32, 64], "occupancy": [1, 2], "num_ctas": [1]},
}
SDPA_PROVIDERS = ("cudnn", "flash")

#: What a result line holds (kind == "result"). Lines of kind "start"/"end" frame each
#: invocation (options, space, counts); readers skip them.
RESULT_FIELDS = """\
schema, kind="result", sweep_id, date (UTC), gpu, arch, commit (git HEAD), dirty,
torch, cuda, cuda_tile, spak; kernel, case (the shape grammar's full id), shape, B, Hq,
Hkv, Sq, Sk, D, dtype, causal, flops; provider ("spak-<kernel>" swept config,
"spak-<kernel>-default" default tiles, "sdpa-cudnn", "sdpa-flash"), config_id, config
({TILE_M, TILE_N, occupancy, num_ctas}; null for SDPA); status (ok, compile_error,
launch_error, wrong_result, invalid_config, unsupported, oom, error, timeout, crash),
error; nonfinite, rel_l2_vs_sdpa, check_rtol; ms_median, ms_min, ms_max, ms_p25, ms_p75,
spread, runs, tflops; first_call_s (includes the compile), wall_s."""


def provider_name(kernel: str, kind: str) -> str:
    return {"config": f"spak-{kernel}", "default": f"spak-{kernel}-default"}.get(
        kind, f"sdpa-{kind}")


# ------------------------------------------------------------------ configs and spaces

def config_id(cfg: Optional[dict]) -> str:
    """"64x128", "64x128/o2", "128x64/o1/c2" (o: occupancy, c: num_ctas; omitted = auto)."""
    if cfg is None:
        return "-"
    s = f"{cfg['TILE_M']}x{cfg['TILE_N']}"
    if cfg.get("occupancy") is not None:
        s += f"/o{cfg['occupancy']}"
    if cfg.get("num_ctas") is not None:
        s += f"/c{cfg['num_ctas']}"
    for k in sorted(set(cfg) - set(SPACE_KEYS)):
        if cfg[k] is not None:
            s += f"/{k}={cfg[k]}"
    return s


def knob_keys() -> tuple:
    """Kernel Constant knobs a config may carry besides the tiles (gpu.plan.LATENCY_KEYS:
    LAT_K, LAT_V, DRAM latency hints 1..10, 0 = the compiler's choice)."""
    try:
        from spak.gpu import plan
    except ImportError:
        return ()
    return tuple(getattr(plan, "LATENCY_KEYS", ()))


def _space_value(key: str, text) -> Optional[int]:
    if isinstance(text, str) and text.strip().lower() in ("auto", "none", "null", "-"):
        if key in ("TILE_M", "TILE_N"):
            raise ValueError(f"{key} cannot be auto")
        return None
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{key}: {text!r} is not an integer") from None
    if key in ("TILE_M", "TILE_N") and (v < 16 or v > 256 or v & (v - 1)):
        raise ValueError(f"{key}: {v} is not a power of two in [16, 256]")
    if key == "occupancy" and not 1 <= v <= 32:
        raise ValueError(f"occupancy: {v} is not in [1, 32] (or auto)")
    if key == "num_ctas" and (not 1 <= v <= 16 or v & (v - 1)):
        raise ValueError(f"num_ctas: {v} is not a power of two in [1, 16] (or auto)")
    if key in knob_keys() and not 0 <= v <= 10:
        raise ValueError(f"{key}: {v} is not in [0, 10] (0: the compiler's choice)")
    return v


def _canon_key(k: str) -> str:
    keys = (*SPACE_KEYS, *knob_keys())
    m = {s.lower(): s for s in keys}
    if k.lower() not in m:
        raise ValueError(f"unknown space key {k!r}; accepted: {', '.join(keys)}")
    return m[k.lower()]


def parse_space_args(items) -> dict:
    """["TILE_M=64,128", "occupancy=1,auto"] -> {"TILE_M": [64, 128], "occupancy": [1, None]}."""
    out = {}
    for item in items or ():
        for part in item.split():
            if "=" not in part:
                raise ValueError(f"--space item {part!r} is not KEY=V1,V2 (e.g. TILE_M=64,128)")
            k, vals = part.split("=", 1)
            key = _canon_key(k.strip())
            values = [_space_value(key, v) for v in vals.split(",") if v.strip()]
            if not values:
                raise ValueError(f"--space {key}: no values")
            out[key] = list(dict.fromkeys(values))
    return out


#: The space key holding the plan's excluded partial configs (not a list of values).
EXCLUDE = "exclude"


def load_space(plan_path, arch: str) -> tuple[dict, str]:
    """(space, where it came from) for ``arch``: the plan's [sweep.<arch>] lists, read with
    spak.recipe.schema's validating loader (plain TOML if that module is absent). A plan that does
    not load is an error (ValueError naming the problem); a plan without [sweep.<arch>], or
    no plan file, falls back to FALLBACK_SPACES (ValueError if that has no entry either)."""
    p = Path(plan_path) if plan_path else DEFAULT_PLAN
    if p.exists():
        try:
            from spak.recipe.schema import load_plan
        except ImportError:
            load_plan = None
        if load_plan is not None:
            try:
                plan = load_plan(p)
            except Exception as e:  # noqa: BLE001 -- PlanError and friends
                raise ValueError(f"the plan {p} does not load: {e}") from None
            try:
                sp = plan.sweep_space(arch)
            except KeyError as e:
                note = str(e).strip("'\"")
            else:
                space = {k: list(getattr(sp, k)) for k in SPACE_KEYS}
                for k, v in (getattr(sp, "knobs", None) or {}).items():
                    space[k] = list(v)
                if getattr(sp, "exclude", ()):
                    space[EXCLUDE] = [dict(e) for e in sp.exclude]
                return space, f"{p} [sweep.{arch}]"
        else:
            import tomllib
            try:
                table = tomllib.loads(p.read_text()).get("sweep", {}).get(arch)
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise ValueError(f"the plan {p} does not load: {e}") from None
            if table is not None:
                space = {}
                for k, v in table.items():
                    try:
                        key = _canon_key(k)
                    except ValueError:
                        continue          # max_tile, note, ...
                    space[key] = [_space_value(key, x) for x in v]
                return space, f"{p} [sweep.{arch}]"
            note = f"{p} has no [sweep.{arch}]"
    else:
        note = f"no plan file {p}"
    if arch not in FALLBACK_SPACES:
        raise ValueError(f"{note}, and SPAK has no built-in sweep space for {arch} "
                         f"(it has {', '.join(FALLBACK_SPACES)}); pass --space")
    return {k: list(v) for k, v in FALLBACK_SPACES[arch].items()}, \
        f"built-in space for {arch} ({note})"


def expand_space(space: dict) -> list[dict]:
    """The cross product of a space, as config dicts (TILE_M, TILE_N required), less the
    configs matching an entry of ``space["exclude"]`` (the plan's known-bad combinations,
    spak.recipe.schema.excluded)."""
    from spak.recipe.schema import excluded
    for k in ("TILE_M", "TILE_N"):
        if not space.get(k):
            raise ValueError(f"the sweep space has no {k} values")
    keys = list(SPACE_KEYS) + [k for k in space if k not in SPACE_KEYS and k != EXCLUDE]
    lists = [space.get(k) or [None] for k in keys]
    seen = {}
    for combo in itertools.product(*lists):
        cfg = dict(zip(keys, combo))
        if not excluded(cfg, space.get(EXCLUDE, ())):
            seen.setdefault(config_id(cfg), cfg)
    return list(seen.values())


# ------------------------------------------------------------------ jobs

@dataclass
class Job:
    kernel: str
    spec: ProblemSpec
    provider: str
    config_id: str
    config: Optional[dict]
    unit: Optional[dict] = None           # compile unit (None: SDPA or not precompilable)

    @property
    def case(self) -> str:
        return self.spec.case_id

    @property
    def key(self) -> tuple:
        return (self.case, self.provider, self.config_id)

    def payload(self) -> dict:
        return {"kernel": self.kernel, "case": self.case, "provider": self.provider,
                "config_id": self.config_id, "config": self.config,
                "flops": self.spec.flops}


def _tiny(d: int) -> int:
    from spak.tune.worker import tiny_dim
    return tiny_dim(d)


def _spec_bits(shape, elem_bytes: int) -> str:
    """What ct.launch specialises a contiguous array on, per dimension: extent divisible
    by 16 (d), stride 16-byte divisible (s), stride 1 (1); e.g. "ds.ds.ds.d-1". An extent
    of 1 is its own class ("u"): torch hands such a dimension over with a normalised
    stride, and on an H200 B=1 compiled a cubin of its own where B=2, 4, 8 shared one
    (results/run-nvidia-h200-2026-11-22.jsonl.gz, first_call_s)."""
    out, stride = [], 1
    for d in reversed(shape):
        if d == 1:
            out.append("u")
        else:
            out.append(("d" if d % 16 == 0 else "-")
                       + ("s" if stride * elem_bytes % 16 == 0 else "-")
                       + ("1" if stride == 1 else ""))
        stride *= d
    return ".".join(reversed(out))


def compile_unit(kernel: str, spec: ProblemSpec, cfg: dict, cid: str) -> Optional[dict]:
    """What cuTile compiles one cubin for, as small arrays with the same JIT specialisation
    (sweep_worker.tiny_dim on every extent but the head dim), or None when the tiny stand-ins cannot mirror the launch
    (int64 indexing past 2^31 elements, a GQA ratio the tiny head counts break)."""
    big = max(math.prod(spec.q_shape), math.prod(spec.kv_shape),
              spec.B * spec.Hq * spec.Sq * spec.Sk if kernel == "naive" else 0)
    if big > 2 ** 31 - 1:
        return None
    # B, heads and sequence lengths shrink; the head dim stays: the kernels' HEAD_DIM
    # Constant (a compile-time value) is derived from it.
    q = [_tiny(d) for d in spec.q_shape[:3]] + [spec.D]
    k = [_tiny(d) for d in spec.kv_shape[:3]] + [spec.D]
    if q[1] % k[1]:
        return None
    arrays = [spec.q_shape, spec.kv_shape]
    if kernel == "naive":
        arrays.append((spec.B, spec.Hq, spec.Sq, spec.Sk))
    bits = "|".join(_spec_bits(a, 2) for a in arrays)
    uid = (f"{kernel}|{cid}|{spec.dtype}|D{spec.D}|{'causal' if spec.causal else 'noncausal'}|"
           f"{bits}")
    return {"unit_id": uid, "kernel": kernel, "config_id": cid, "config": cfg,
            "dtype": spec.dtype, "causal": spec.causal, "q": q, "k": k, "case": spec.case_id}


def plan_jobs(kernel: str, specs, configs, *, arch: str = "sm_90", default: bool = True,
              sdpa=SDPA_PROVIDERS) -> list[Job]:
    """Every job, in run order: SDPA per shape first (no compile: they run while the
    helpers compile), then the default tiles per shape, then config by config over the
    shapes (consecutive jobs share a compiled variant)."""
    from spak.gpu.plan import default_tiles
    jobs = []
    for spec in specs:
        for name in sdpa:
            jobs.append(Job(kernel, spec, f"sdpa-{name}", "-", None))
    if default:
        for spec in specs:
            cfg = {**default_tiles(spec.D, arch, spec.causal), "occupancy": None, "num_ctas": None}
            jobs.append(Job(kernel, spec, provider_name(kernel, "default"), "default", cfg,
                            compile_unit(kernel, spec, cfg, "default")))
    for cfg in configs:
        cid = config_id(cfg)
        for spec in specs:
            jobs.append(Job(kernel, spec, provider_name(kernel, "config"), cid, dict(cfg),
                            compile_unit(kernel, spec, cfg, cid)))
    return jobs


# ------------------------------------------------------------------ results file

# ------------------------------------------------------------------ child processes

class _Child:
    """One sweep_worker subprocess: JSON commands on stdin, JSON replies on a private pipe,
    its stdout/stderr into the log. Its own process group, so a kill takes its compiler
    subprocesses too."""

    def __init__(self, role: str, runner: str, opts: dict, log, sel: selectors.BaseSelector):
        r, w = os.pipe()
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"]
                                         if env.get("PYTHONPATH") else "")
        env.setdefault("PYTHONUNBUFFERED", "1")
        cmd = [sys.executable, "-m", "spak.tune.worker", "--fd", str(w), "--role", role,
               "--runner", runner, "--opts", json.dumps(opts), "--parent", str(os.getpid())]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=log,
                                     pass_fds=(w,), start_new_session=True, env=env,
                                     cwd=str(ROOT))
        os.close(w)
        self.rfd = r
        os.set_blocking(r, False)
        self.buf = b""
        self.lines: list[dict] = []
        self.eof = False
        self.sel = sel
        sel.register(r, selectors.EVENT_READ, self)
        self.role = role
        self.started = time.monotonic()

    def send(self, obj) -> bool:
        try:
            self.proc.stdin.write((json.dumps(obj) + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def on_readable(self) -> None:
        try:
            chunk = os.read(self.rfd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            try:
                self.sel.unregister(self.rfd)
            except (KeyError, ValueError):
                pass
            return
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            if line.strip():
                try:
                    self.lines.append(json.loads(line))
                except json.JSONDecodeError:
                    pass

    def pop(self) -> Optional[dict]:
        return self.lines.pop(0) if self.lines else None

    def exit_code(self, wait_s: float = 2.0):
        try:
            return self.proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                try:
                    self.proc.kill()
                except ProcessLookupError:
                    pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.close()

    def close(self) -> None:
        try:
            self.sel.unregister(self.rfd)
        except (KeyError, ValueError):
            pass
        for f in (self.proc.stdin,):
            try:
                f.close()
            except OSError:
                pass
        try:
            os.close(self.rfd)
        except OSError:
            pass

    def stop(self) -> None:
        """Ask politely (exit op), then kill."""
        if self.proc.poll() is None:
            self.send({"op": "exit"})
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


def _log_tail(path: Optional[Path], n: int = 15) -> str:
    if path is None or not path.exists():
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


# ------------------------------------------------------------------ the sweep

@dataclass
class SweepOptions:
    kernel: str = "fused"
    timeout: float = 120.0              # per config, seconds (compile + check + timing)
    budget_s: Optional[float] = None    # wall clock for the whole invocation
    compile_jobs: int = 0               # compile helper processes (0: the worker compiles)
    runner: str = "gpu"
    timing: dict = field(default_factory=dict)
    retry_failed: bool = False
    commit: Optional[str] = None
    startup_timeout: float = 180.0
    quiet: bool = False


class Sweep:
    """The scheduler: feeds jobs to the worker, keeps compile helpers ahead of it, records
    every result (or failure) as a JSON line, restarts the worker after a hang or a crash,
    and stops before the budget runs out."""

    def __init__(self, out_path, opts: SweepOptions, *, log_path=None, echo=print):
        self.out_path = Path(out_path)
        self.opts = opts
        self.log_path = Path(log_path) if log_path else self.out_path.with_suffix(".log")
        self.echo = echo
        self.sel = selectors.DefaultSelector()
        self.worker: Optional[_Child] = None
        self.helpers: list[_Child] = []
        self.helper_queue: dict = {}        # helper -> list of units (first = in flight)
        self.helper_since: dict = {}        # helper -> monotonic time of its last progress
        self.unit_state: dict = {}          # unit_id -> reply dict
        self.units_todo: list[dict] = []
        self.env: dict = {}
        self.sweep_id = uuid.uuid4().hex[:12]
        self.t0 = time.monotonic()
        self.log = None
        self.counts: dict = {}
        self.stopped_reason: Optional[str] = None
        self.walls: list[float] = []
        self.best: dict = {}                # case -> (tflops, config_id)
        self.worker_starts = 0
        self.helper_failures = 0

    # -- children
    def _open_log(self):
        if self.log is None:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.log = open(self.log_path, "ab")
        return self.log

    def _child(self, role: str) -> _Child:
        return _Child(role, self.opts.runner, self.opts.timing, self._open_log(), self.sel)

    def _pump(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for any child's output and take it in."""
        for key, _ in self.sel.select(timeout=max(0.0, timeout)):
            key.data.on_readable()
        self._service_helpers()

    def start_worker(self) -> dict:
        """A fresh worker; returns its hello (GPU name, arch, versions). Raises RuntimeError
        when it cannot start (no GPU, no torch): the sweep cannot go on."""
        if self.worker is not None:
            self.worker.kill()
        w = self._child("worker")
        w.send({"op": "hello"})
        deadline = time.monotonic() + self.opts.startup_timeout
        while time.monotonic() < deadline:
            msg = w.pop()
            if msg is not None:
                if "hello" in msg:
                    self.worker = w
                    self.worker_starts += 1
                    return msg["hello"]
                if "fatal_setup" in msg:
                    w.kill()
                    raise RuntimeError(msg["fatal_setup"])
                continue
            if w.eof:
                code = w.exit_code()
                w.kill()
                raise RuntimeError(f"the sweep worker exited at start-up (status {code}); "
                                   f"its log {self.log_path} ends with:\n"
                                   + _log_tail(self.log_path))
            self._pump(0.5)
        w.kill()
        raise RuntimeError(f"the sweep worker did not start within "
                           f"{self.opts.startup_timeout:.0f} s; see {self.log_path}")

    # -- compile helpers
    def start_helpers(self, units: list[dict]) -> None:
        seen, todo = set(), []
        for u in units:
            if u and u["unit_id"] not in seen and u["unit_id"] not in self.unit_state:
                seen.add(u["unit_id"])
                todo.append(u)
        self.units_todo = todo
        for _ in range(min(self.opts.compile_jobs, len(todo))):
            self._spawn_helper()

    def _spawn_helper(self) -> None:
        if not self.units_todo:
            return
        h = self._child("compile")
        self.helpers.append(h)
        self.helper_queue[h] = []
        self._feed(h)

    def _feed(self, h: _Child) -> None:
        if self.units_todo:
            u = self.units_todo.pop(0)
            self.helper_queue[h] = [u]
            self.helper_since[h] = time.monotonic()
            if not h.send({"op": "compile", "unit": u}):
                h.eof = True
        else:
            self.helper_queue[h] = []
            h.send({"op": "exit"})

    def _retire(self, h: _Child, reason: str) -> None:
        h.kill()
        self.helpers.remove(h)
        for u in self.helper_queue.pop(h, []):
            if reason == "timeout":
                self.unit_state[u["unit_id"]] = {
                    "status": "timeout",
                    "error": f"compiling this variant took over {self.opts.timeout:.0f} s "
                             f"(--timeout; compile helper killed)"}
            else:   # a helper crash: let the worker try the unit itself (isolated there)
                self.unit_state[u["unit_id"]] = {"status": "fallback", "error": reason}
        self.helper_since.pop(h, None)
        if reason != "timeout":
            self.helper_failures += 1
            if self.helper_failures >= 3 and self.opts.compile_jobs > 0:
                self.echo(f"compile helpers keep failing ({reason}); the worker compiles "
                          f"the remaining variants itself")
                self.opts.compile_jobs = 0
        if self.units_todo and self.opts.compile_jobs > 0:
            self._spawn_helper()

    def _service_helpers(self) -> None:
        now = time.monotonic()
        for h in list(self.helpers):
            while True:
                msg = h.pop()
                if msg is None:
                    break
                if "compiled" in msg:
                    r = msg["compiled"]
                    self.unit_state[r["unit_id"]] = r
                    self.helper_queue[h] = [u for u in self.helper_queue[h]
                                            if u["unit_id"] != r["unit_id"]]
                    if r.get("fatal"):
                        h.eof = True
                    else:
                        self._feed(h)
                elif "fatal_setup" in msg:
                    self.echo(f"compile helper could not start: {msg['fatal_setup']}; the "
                              f"worker compiles instead")
                    self.opts.compile_jobs = 0
                    h.eof = True
            if h.eof or h.proc.poll() is not None:
                pending = self.helper_queue.get(h, [])
                if pending:
                    code = h.exit_code(0.5)
                    self._retire(h, f"compile helper exited (status {code})")
                else:
                    h.kill()
                    self.helpers.remove(h)
                    self.helper_queue.pop(h, None)
                    self.helper_since.pop(h, None)
                    if self.units_todo and self.opts.compile_jobs > 0:
                        self._spawn_helper()
                continue
            if self.helper_queue.get(h) and now - self.helper_since.get(h, now) > \
                    self.opts.timeout:
                self._retire(h, "timeout")
        if not self.helpers and self.units_todo and self.opts.compile_jobs == 0:
            for u in self.units_todo:       # helpers gave up: the worker compiles these
                self.unit_state.setdefault(u["unit_id"], {"status": "fallback"})
            self.units_todo = []

    def _ready(self, job: Job) -> bool:
        if job.unit is None or self.opts.compile_jobs <= 0 and not self.helpers:
            return True
        return job.unit["unit_id"] in self.unit_state

    # -- one job
    def _base_row(self, job: Job) -> dict:
        s = job.spec
        return {"schema": SCHEMA, "kind": "result", "sweep_id": self.sweep_id,
                "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                **self.env, "kernel": job.kernel, "case": job.case, "shape": s.label,
                "B": s.B, "Hq": s.Hq, "Hkv": s.Hkv, "Sq": s.Sq, "Sk": s.Sk, "D": s.D,
                "dtype": s.dtype, "causal": s.causal, "flops": s.flops,
                "provider": job.provider, "config_id": job.config_id, "config": job.config}

    def _run_job(self, job: Job, deadline: Optional[float]) -> Optional[dict]:
        """The job's result fields, or None when the budget ran out while it was in flight
        (not recorded: --resume runs it again)."""
        if job.unit is not None:
            st = self.unit_state.get(job.unit["unit_id"])
            if st and st.get("status") in ("compile_error", "timeout"):
                return {"status": st["status"], "error": "(compile helper) " + st["error"],
                        "wall_s": 0.0}
        if self.worker is None:
            self.start_worker()
        w = self.worker
        t0 = time.monotonic()
        if not w.send({"op": "job", "job": job.payload()}):
            w.eof = True
        limit = t0 + self.opts.timeout
        budget_kill = deadline is not None and deadline < limit
        end = min(limit, deadline) if deadline is not None else limit
        while True:
            msg = w.pop()
            if msg is not None and "result" in msg:
                r = msg["result"]
                if r.pop("fatal", False):
                    w.exit_code(5)
                    w.kill()
                    self.worker = None
                return r
            if w.eof or w.proc.poll() is not None:
                self._pump(0.05)             # a last reply may still be in the pipe
                msg = w.pop()
                if msg is not None and "result" in msg:
                    last = msg["result"]
                    w.kill()
                    self.worker = None
                    last.pop("fatal", None)
                    return last
                code = w.exit_code()
                w.kill()
                self.worker = None
                sig = f"signal {-code}" if isinstance(code, int) and code < 0 else \
                    f"status {code}"
                tail = _log_tail(self.log_path, 8)
                return {"status": "crash", "wall_s": time.monotonic() - t0,
                        "error": f"the worker died ({sig}) during this config"
                                 + (f"; log tail:\n{tail}" if tail else "")}
            now = time.monotonic()
            if now >= end:
                w.kill()
                self.worker = None
                if budget_kill and now < limit:
                    return None
                return {"status": "timeout", "wall_s": now - t0,
                        "error": f"no result within --timeout {self.opts.timeout:g} s "
                                 f"(worker killed; a fresh one takes the next config)"}
            self._pump(min(0.5, end - now))

    # -- the loop
    def run(self, jobs: list[Job], writer: ResultsWriter, env: dict, *,
            done: set = frozenset()) -> dict:
        """Run every job not in ``done``; returns the counts and the stop reason."""
        self.env = env
        todo = [j for j in jobs if j.key not in done]
        total = len(todo)
        self.start_helpers([j.unit for j in todo if j.unit is not None])
        cost = {id(j): job_seconds(j, self.opts.timing) for j in todo}
        self._eta = {"left": sum(cost.values()), "done": 0.0}
        deadline = self.t0 + self.opts.budget_s if self.opts.budget_s else None
        finished = 0
        run_t0 = time.monotonic()
        while todo:
            now = time.monotonic()
            if deadline is not None:
                est = statistics.median(self.walls[-20:]) if self.walls else 2.0
                if now + est > deadline:
                    self.stopped_reason = "budget"
                    break
            job = next((j for j in todo if self._ready(j)), None)
            if job is None:
                self._pump(0.5)
                continue
            todo.remove(job)
            try:
                r = self._run_job(job, deadline)
            except RuntimeError as e:           # the worker cannot (re)start
                self.stopped_reason = f"worker: {e}"
                break
            if r is None:
                self.stopped_reason = "budget"
                todo.insert(0, job)
                break
            row = {**self._base_row(job), **r}
            if row.get("status") == "ok" and row.get("ms_median"):
                row["tflops"] = job.spec.flops / (row["ms_median"] * 1e-3) / 1e12
            writer.write(row)
            finished += 1
            self._eta["left"] -= cost[id(job)]
            self._eta["done"] += cost[id(job)]
            self.counts[row["status"]] = self.counts.get(row["status"], 0) + 1
            if row.get("wall_s"):
                self.walls.append(float(row["wall_s"]))
            self._progress(finished, total, row, time.monotonic() - run_t0)
        self.left = len(todo)
        self.shutdown()
        return {"finished": finished, "left": len(todo), "counts": dict(self.counts),
                "stopped": self.stopped_reason}

    def shutdown(self) -> None:
        for h in list(self.helpers):
            h.kill()
        self.helpers = []
        if self.worker is not None:
            self.worker.stop()
            self.worker = None
        if self.log is not None:
            self.log.close()
            self.log = None

    # -- printing
    def _progress(self, done: int, total: int, row: dict, elapsed: float) -> None:
        if self.opts.quiet:
            return
        frac = done / total if total else 1.0
        bar = "#" * int(20 * frac) + "-" * (20 - int(20 * frac))
        # the modelled cost of what is left, scaled by how the model fared so far
        e = getattr(self, "_eta", None)
        eta = (elapsed / e["done"] * max(e["left"], 0.0)) if e and e["done"] > 0 else \
            (elapsed / done * (total - done) if done else 0.0)
        tf = row.get("tflops")
        mark = ""
        if tf and row["provider"].startswith("spak-"):
            best = self.best.get(row["case"])
            if best is None or tf > best[0]:
                self.best[row["case"]] = (tf, row["config_id"])
                mark = "  * best so far"
        res = f"{tf:7.1f} TFLOPS" if tf else f"{row['status'].upper():>14}"
        who = row["config_id"] if row["provider"].startswith("spak-") and \
            not row["provider"].endswith("-default") else \
            ("default " + _tiles_text(row.get("config")) if row["provider"].endswith("-default")
             else row["provider"])
        line = (f"[{bar}] {done:>4}/{total} {100 * frac:3.0f}% ETA {_fmt_s(eta):>6} | "
                f"{row['case']:<30} {who:<18} {res}{mark}")
        if row.get("status") != "ok" and row.get("error"):
            line += "\n      " + str(row["error"]).strip().splitlines()[0][:200]
        self.echo(line)


def _tiles_text(cfg) -> str:
    return f"{cfg['TILE_M']}x{cfg['TILE_N']}" if cfg else ""


def _fmt_s(s: float) -> str:
    s = max(0, int(round(s)))
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


# ------------------------------------------------------------------ estimates, summary

def job_seconds(job: Job, timing: Optional[dict] = None, tflops: float = 300.0) -> float:
    """Modelled seconds of one job without its compile: warm-up and estimate calls, the
    timed batches (each at least batch_ms), ~60 ms for inputs, reference and check."""
    t = {"warmup": 3, "batches": 5, "batch_ms": 40.0, **(timing or {})}
    call = job.spec.flops / (tflops * 1e12)
    return (t["warmup"] + 1) * call + t["batches"] * max(call, t["batch_ms"] / 1e3) + 0.06


def estimate_seconds(jobs: list[Job], *, compile_jobs: int, compile_s: float = 3.0,
                     tflops: float = 300.0, timing: Optional[dict] = None) -> dict:
    """A rough, conservative wall-clock estimate: each job's calls (warm-up, estimate,
    batches of ~batch_ms each) at ``tflops``, ~60 ms of overhead (inputs, check), plus
    the compiles (``compile_s`` each, twice the 1.2-1.8 s first calls seen on an H200,
    spread over the helpers, ~0.3 s each for the worker's cache hit), added as if they
    did not overlap the timing (they mostly do)."""
    run_s = sum(job_seconds(j, timing, tflops) for j in jobs)
    units = {j.unit["unit_id"] for j in jobs if j.unit}
    n_units = len(units) + sum(1 for j in jobs if j.unit is None and j.config is not None)
    compile_total = n_units * compile_s
    if compile_jobs > 0:
        compile_wall = compile_total / compile_jobs + 10.0 + n_units * 0.3
    else:
        compile_wall = compile_total
    return {"jobs": len(jobs), "compile_units": n_units, "run_s": run_s,
            "compile_s": compile_wall, "startup_s": 15.0,
            "total_s": run_s + compile_wall + 15.0}


def summarize(rows: list[dict]) -> list[str]:
    """Lines of the end-of-sweep table: per shape the best config (marked *), the default
    tiles, SDPA cuDNN and flash, and the ratios."""
    by_case: dict = {}
    for r in rows:
        if r.get("kind") != "result":
            continue
        by_case.setdefault(r["case"], []).append(r)
    hdr = (f"{'shape':<30} {'best config':<16} {'TFLOPS':>7} {'default':>7} {'cuDNN':>7} "
           f"{'flash':>7} {'best/def':>8} {'best/cuDNN':>10}  failed")
    lines = [hdr]
    for case, rs in by_case.items():
        ok = [r for r in rs if r.get("status") == "ok" and r.get("tflops")]
        ours = [r for r in ok if str(r["provider"]).startswith("spak-")]
        best = max(ours, key=lambda r: r["tflops"], default=None)
        dflt = max((r for r in ok if str(r["provider"]).endswith("-default")),
                   key=lambda r: r["tflops"], default=None)
        cud = next((r for r in ok if r["provider"] == "sdpa-cudnn"), None)
        fla = next((r for r in ok if r["provider"] == "sdpa-flash"), None)
        nfail = sum(1 for r in rs if r.get("status") != "ok")

        def f(r):
            return f"{r['tflops']:7.1f}" if r else f"{'-':>7}"
        bid = (best["config_id"] if best and not best["provider"].endswith("-default")
               else "default") if best else "-"
        lines.append(f"{case:<30} {('* ' + bid):<16} {f(best)} {f(dflt)} {f(cud)} {f(fla)} "
                     f"{(best['tflops'] / dflt['tflops'] if best and dflt else float('nan')):8.3f} "
                     f"{(best['tflops'] / cud['tflops'] if best and cud else float('nan')):10.3f}"
                     f"  {nfail}")
    return lines


# ------------------------------------------------------------------ command line

def _auto_compile_jobs(runner: str) -> int:
    if runner != "gpu":
        return 0
    try:
        from cuda.tile._cext import default_tile_context
        if default_tile_context.config.cache_dir is None:
            return 0                     # no disk cache: helpers' cubins would be lost
        from cuda.tile._compile import _get_compiler_version_string
        if _get_compiler_version_string() is None:
            return 0                     # cuTile keeps no disk cache without it either
    except Exception:  # noqa: BLE001
        pass
    return max(0, min(8, (os.cpu_count() or 2) - 2))


def _done_keys(rows, gpu: str, kernel: str, retry_failed: bool) -> set:
    done = set()
    for r in rows:
        if r.get("schema") != SCHEMA or r.get("kind") != "result" or r.get("gpu") != gpu:
            continue
        if row_problem(r) or not all(isinstance(r.get(k), str)
                                     for k in ("case", "provider", "config_id")):
            continue                    # a malformed row is not "done": it runs again
        if r.get("kernel") != kernel and str(r.get("provider", "")).startswith("spak-"):
            continue
        if retry_failed and r.get("status") != "ok":
            continue
        done.add((r["case"], r["provider"], r["config_id"]))
    return done


def cmd_sweep(args: argparse.Namespace) -> int:
    say = print
    try:
        specs = select_cases(args.shapes, dtype=args.dtype, causal=args.causal)
    except ShapeError as e:
        print(f"spak sweep: error: argument --shapes: {e}", file=sys.stderr)
        return 2
    masked = [s for s in specs if s.mask is not None]
    specs = [s for s in specs if s.mask is None]
    if masked:
        print(f"spak sweep: skipping {len(masked)} masked shape(s) (the sweep times unmasked "
              f"attention): {', '.join(s.case_id for s in masked[:3])}"
              + (" ..." if len(masked) > 3 else ""), file=sys.stderr)
    if not specs:
        print("spak sweep: error: no (unmasked) shape selected", file=sys.stderr)
        return 2
    try:
        override = parse_space_args(args.space)
    except ValueError as e:
        print(f"spak sweep: error: argument --space: {e}", file=sys.stderr)
        return 2
    timing = {"warmup": args.warmup, "batches": args.batches, "batch_ms": args.batch_ms,
              "max_sets": args.max_sets}
    runner = args.runner
    compile_jobs = _auto_compile_jobs(runner) if args.compile_jobs == "auto" \
        else int(args.compile_jobs)

    def jobs_for(arch):
        space, src = load_space(args.plan, arch)
        space.update(override)
        if override:
            src += " with --space " + " ".join(
                f"{k}={','.join('auto' if v is None else str(v) for v in vals)}"
                for k, vals in override.items())
        configs = expand_space(space)
        return space, src, configs, plan_jobs(
            args.kernel, specs, configs, arch=arch, default=not args.no_default,
            sdpa=() if args.no_sdpa else SDPA_PROVIDERS)

    if args.list:
        try:
            space, src, configs, jobs = jobs_for(args.arch or "sm_90")
        except ValueError as e:
            print(f"spak sweep: error: {e}", file=sys.stderr)
            return 2
        for j in jobs:
            print(f"{j.case:<30} {j.provider:<20} {j.config_id}")
        est = estimate_seconds(jobs, compile_jobs=compile_jobs or 8, timing=timing)
        print(f"{len(configs)} configs from {src}: {json.dumps(space)}")
        print(f"{len(specs)} shapes, {est['jobs']} jobs, {est['compile_units']} compile units; "
              f"estimate ~{_fmt_s(est['total_s'])} on an H100/H200 ({_fmt_s(est['run_s'])} "
              f"timing, ~{_fmt_s(est['compile_s'])} compiling with {compile_jobs or 8} "
              f"helpers, start-up)")
        return 0

    commit, dirty = git_commit(args.commit)
    opts = SweepOptions(kernel=args.kernel, timeout=args.timeout, budget_s=args.budget_s,
                        compile_jobs=compile_jobs, runner=runner, timing=timing,
                        retry_failed=args.retry_failed, commit=commit)
    out_arg = args.out
    # The worker reports the GPU name, which the automatic --out name needs; until then the
    # log has a fixed name for automatic outputs.
    sweep = Sweep(Path(out_arg) if out_arg != "auto" else ROOT / "results" / "sweep.jsonl",
                  opts, log_path=(Path(out_arg).with_suffix(".log") if out_arg != "auto"
                                  else ROOT / "results" / "sweep-worker.log"))
    try:
        hello = sweep.start_worker()
    except RuntimeError as e:
        print(f"spak sweep: cannot start: {e}", file=sys.stderr)
        sweep.shutdown()
        return 1
    gpu, arch = hello["gpu"], args.arch or hello["arch"]
    if out_arg == "auto":
        date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
        out_path = ROOT / "results" / f"sweep-{(slug(gpu) or 'gpu')}-{args.kernel}-{date}.jsonl"
        sweep.out_path = out_path
    else:
        out_path = Path(out_arg)
    try:
        space, src, configs, jobs = jobs_for(arch)
    except ValueError as e:
        print(f"spak sweep: error: {e}", file=sys.stderr)
        sweep.shutdown()
        return 2
    existing = read_results(out_path, warn=lambda m: print("warning: " + m, file=sys.stderr))
    if existing and not args.resume:
        print(f"spak sweep: {out_path} already holds {len(existing)} lines: pass --resume to "
              f"continue it (skipping what it has), or choose another --out", file=sys.stderr)
        sweep.shutdown()
        return 2
    done = _done_keys(existing, gpu, args.kernel, args.retry_failed) if args.resume else set()
    todo = [j for j in jobs if j.key not in done]
    env = {"gpu": gpu, "arch": arch, "commit": commit, "dirty": dirty,
           "torch": hello.get("torch"), "cuda": hello.get("cuda"),
           "cuda_tile": hello.get("cuda_tile"), "spak": __version__}
    est = estimate_seconds(todo, compile_jobs=compile_jobs, timing=timing)
    say(f"spak sweep on {gpu} ({arch}), kernel {args.kernel}: {len(configs)} configs from "
        f"{src}\n  space {json.dumps(space)}\n  {len(specs)} shapes, {len(jobs)} jobs"
        + (f", {len(jobs) - len(todo)} already in {out_path} (resumed)" if done else "")
        + f"; {est['compile_units']} compile units, {compile_jobs} compile helpers; estimate "
          f"~{_fmt_s(est['total_s'])}"
        + (f" (budget {_fmt_s(args.budget_s)})" if args.budget_s else "")
        + f"\n  results -> {out_path} (worker log {sweep.log_path}); commit "
          f"{commit or 'unknown (pass --commit)'}", flush=True)
    writer = ResultsWriter(out_path)
    writer.write({"schema": SCHEMA, "kind": "start", "sweep_id": sweep.sweep_id,
                  "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  **env, "kernel": args.kernel, "space": space, "space_source": src,
                  "shapes": [s.case_id for s in specs], "jobs": len(jobs),
                  "todo": len(todo), "options": {"timeout": args.timeout,
                                                 "budget_s": args.budget_s,
                                                 "compile_jobs": compile_jobs, **timing},
                  "command": "spak " + shlex.join(args.argv or sys.argv[1:]),
                  "parent_pid": os.getpid(), "worker_pid": hello.get("pid")})
    interrupted = False
    try:
        res = sweep.run(jobs, writer, env, done=done)
    except KeyboardInterrupt:
        interrupted = True
        sweep.shutdown()
        res = {"finished": None, "left": None, "counts": sweep.counts, "stopped": "interrupted"}
    status = "complete" if not res["stopped"] else res["stopped"]
    writer.write({"schema": SCHEMA, "kind": "end", "sweep_id": sweep.sweep_id,
                  "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                  "gpu": gpu, "status": status, "left": res["left"], "counts": res["counts"],
                  "worker_starts": sweep.worker_starts, "wall_s": time.monotonic() - sweep.t0})
    writer.close()
    rows = [r for r in read_results(out_path)
            if r.get("kind") == "result" and r.get("gpu") == gpu
            and (r.get("kernel") == args.kernel or str(r["provider"]).startswith("sdpa-"))
            and r.get("case") in {s.case_id for s in specs}]
    say("\n".join(summarize(rows)))
    counts = ", ".join(f"{v} {k}" for k, v in sorted(res["counts"].items()))
    say(f"spak sweep: {status}; this run: {counts or 'nothing to do'}; "
        f"{_fmt_s(time.monotonic() - sweep.t0)} wall; results in {out_path}")
    if args.update_store:
        from spak.tune import choose as store
        try:
            changes = store.update_store([out_path], path=args.store,
                                         tiles_only=args.store_tiles_only, gpu=gpu,
                                         kernel=args.kernel)
        except Exception as e:  # noqa: BLE001
            print(f"spak sweep: could not update the store: {type(e).__name__}: {e}",
                  file=sys.stderr)
            return 1
        for line in changes:
            say("  store: " + line)
    if interrupted:
        return 130
    if res["stopped"] == "budget":
        say(f"spak sweep: stopped before --budget-s {args.budget_s:g}: {res['left']} jobs "
            f"left; run the same command with --resume to finish")
        return 3
    if res["stopped"]:
        print(f"spak sweep: stopped: {res['stopped']}", file=sys.stderr)
        return 1
    return 0


DESCRIPTION = __doc__.split("\n\n", 1)[1]


def register(subparsers) -> None:
    """Add `spak sweep`."""
    from spak.cli.args import describe_sets as _describe_sets
    p = subparsers.add_parser(
        "sweep", help="sweep tile configs on the local GPU: check, time, find the best",
        description=DESCRIPTION, epilog=GRAMMAR_HELP.format(sets=_describe_sets())
        + "\n\nresult lines (JSON):\n  " + RESULT_FIELDS.replace("\n", "\n  "),
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=cmd_sweep, argv=None)


def add_arguments(p) -> None:
    from spak.cli.args import shape_arg
    p.add_argument("--kernel", choices=("fused", "naive"), default="fused")
    p.add_argument("--shapes", nargs="+", type=shape_arg, default=["standard"],
                   metavar="SHAPE", help="named sets and/or shapes (default: standard)")
    p.add_argument("--dtype", choices=("fp16", "bf16", "all"), default="fp16")
    p.add_argument("--causal", choices=("yes", "no", "both"), default="both")
    p.add_argument("--plan", default=str(DEFAULT_PLAN),
                   help="plan file whose [sweep.<arch>] is the search space "
                        "(default: plans/fmha.toml)")
    p.add_argument("--space", nargs="+", default=None, metavar="KEY=V,V",
                   help="override space lists: TILE_M=64,128 TILE_N=64,128 occupancy=1,2,auto "
                        "num_ctas=1 (auto: left to cuTile); kernel knobs too, e.g. "
                        "LAT_K=0,4 LAT_V=0,4 (0: the compiler's choice)")
    p.add_argument("--arch", default=None,
                   help="use this arch's space (default: the GPU's; sm_90 for --list)")
    p.add_argument("--out", default="auto", metavar="PATH",
                   help="results JSONL, appended (default: results/sweep-<gpu>-<kernel>-"
                        "<date>.jsonl); the worker log goes beside it (.log)")
    p.add_argument("--resume", action="store_true",
                   help="continue --out: skip the (shape, provider, config) it already has")
    p.add_argument("--retry-failed", action="store_true",
                   help="with --resume: run again what failed (timeouts, crashes, ...)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds one config may take (compile + check + timing) before its "
                        "worker is killed (default 120)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="wall-clock budget: start no job that would not finish in it; "
                        "exit 3 (resumable) if jobs are left")
    p.add_argument("--compile-jobs", default="auto",
                   help="compile helper processes ahead of the worker (default auto: "
                        "min(8, CPUs-2) on a GPU; 0: the worker compiles)")
    p.add_argument("--warmup", type=int, default=3, help="untimed calls (default 3)")
    p.add_argument("--batches", type=int, default=5,
                   help="timed batches; the median batch is reported (default 5)")
    p.add_argument("--batch-ms", type=float, default=40.0,
                   help="target length of one batch of back-to-back calls (default 40)")
    p.add_argument("--max-sets", type=int, default=4,
                   help="input sets rotated so L2 does not flatter small shapes (default 4)")
    p.add_argument("--no-sdpa", action="store_true", help="do not time SDPA cuDNN/flash")
    p.add_argument("--no-default", action="store_true", help="do not time the default tiles")
    p.add_argument("--update-store", action="store_true",
                   help="write the best config per bucket into the tuned-config store")
    p.add_argument("--store", default=None,
                   help="tuned-config store path (default spak/data/tuned_configs.json)")
    p.add_argument("--store-tiles-only", action="store_true",
                   help="store only configs without occupancy/num_ctas hints (for a spak.fmha "
                        "that applies TILE_M/TILE_N only)")
    p.add_argument("--commit", default=None,
                   help="git commit to record (default: git rev-parse HEAD, or $SPAK_COMMIT)")
    p.add_argument("--list", action="store_true",
                   help="print the jobs and a time estimate, run nothing (no GPU needed)")
    p.add_argument("--runner", default=os.environ.get("SPAK_SWEEP_RUNNER", "gpu"),
                   help=argparse.SUPPRESS)   # "fake:SPEC" for the CPU tests


def main(argv=None) -> int:
    """`python -m spak.tune.sweep ...` (same as `spak sweep ...`)."""
    p = argparse.ArgumentParser(prog="python -m spak.tune.sweep", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    args.argv = ["sweep", *(sys.argv[1:] if argv is None else argv)]
    return cmd_sweep(args)


if __name__ == "__main__":
    sys.exit(main())
