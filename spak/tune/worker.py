"""The sweeper's child processes: a measuring worker and compile helpers (see spak.tune.sweep).

    python -m spak.tune.worker --fd N [--role worker|compile] [--runner gpu|fake:SPEC]

Commands arrive on stdin, one JSON object a line; replies go to file descriptor N, one
JSON object a line (stdout and stderr stay free for cuTile's and torch's own chatter):

    {"op": "hello"}               -> {"hello": {gpu, arch, ..., startup: {main_at,
                                      ready_at (monotonic clock), phases: {name: s}}}}
    {"op": "job", "job": {...}}   -> {"result": {...}}   (role worker: check + time one config)
    {"op": "compile", "unit": {}} -> {"compiled": {...}} (role compile: JIT-compile one variant)
    {"op": "exit"} or end of stdin -> the process exits

A result carries ``status`` (see STATUSES) and, if it is not "ok", ``error``. A result with
``"fatal": true`` means the CUDA context is unusable (a sticky launch error): the process
exits right after replying and the parent starts a fresh one.

Runners: ``gpu`` (torch + cuTile on the local CUDA GPU) and ``fake:SPEC`` (no GPU: SPEC is a
JSON file or inline JSON naming configs that fail to compile, raise at launch, return a
wrong result, hang or crash; the CPU tests use it). The worker dies with its parent
(PR_SET_PDEATHSIG on Linux, and it exits on end of stdin).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import zlib

from spak.core.stats import stats
from spak.results.jsonl import jsonable as _jsonable

__all__ = ["STATUSES", "CHECK_GATE_FACTOR", "check_threshold", "GpuRunner", "FakeRunner",
           "FAULTS_ENV", "FaultInjector", "with_faults", "make_runner", "main", "tiny_dim", "stats"]

#: Every status a result line may have. Written by the worker: ok, compile_error,
#: launch_error, wrong_result, invalid_config, unsupported (an SDPA backend refused the
#: shape), oom, error. Written by the parent: timeout, crash.
STATUSES = ("ok", "compile_error", "launch_error", "wrong_result", "invalid_config",
            "unsupported", "oom", "error", "timeout", "crash")

#: A config's outputs are checked against the family's peer reference (PyTorch SDPA for
#: attention) with this many times the family's float64 gate: a correct kernel is within
#: the gate of float64, and so is the peer, so by the triangle inequality two correct
#: outputs differ by at most twice the gate (FMHA forward: 2e-3 fp16, 1.6e-2 bf16). A wrong
#: tile config (a skipped or doubled key tile, a bad mask edge) is off by 1e-1 or more;
#: NaN/Inf anywhere fails regardless.
CHECK_GATE_FACTOR = 2.0


def check_threshold(fam, problem) -> float:
    """The largest relative L2 vs the peer reference that passes (the tightest output's)."""
    return CHECK_GATE_FACTOR * min(fam.gate(problem, n) for n in fam.outputs)


def tiny_dim(d: int) -> int:
    """A small extent with the same cuTile JIT specialisation as ``d``.

    ct.launch specialises a kernel on, per dimension, "extent divisible by 16", "stride
    16-byte divisible" and "stride is 1". Keeping d mod 16, and 1 as 1, keeps all three for
    contiguous arrays (strides are products of later extents), so a compile on the tiny
    arrays builds the very cubin the full-size launch needs (it lands in cuTile's disk cache,
    keyed by the bytecode). Multiples of 16 become 16, others a value in [1, 31]."""
    d = int(d)
    return 16 if d % 16 == 0 else (d if d < 32 else 16 + d % 16)


# ------------------------------------------------------------------ fake runner (CPU tests)

class FakeRunner:
    """A runner with no GPU. SPEC keys (all optional):

    gpu, arch              what hello reports ("Fake GPU", "sm_90")
    delay_s                seconds each job takes (default 0.01)
    startup_s              seconds the worker takes to start (as torch + CUDA init would)
    compile_delay_s        seconds each compile unit takes (default 0.01)
    compile_error, launch_error, wrong, nan, hang, crash, compile_hang, compile_crash,
    cpu_unmapped:          lists of config ids ("64x128/occ2"), or "ID@CASE" for one shape
                           ("default" is the default tiles; "sdpa-flash" etc. the providers);
                           cpu_unmapped: units a CPU compile helper hands to a GPU helper
    cpu_setup_error        true: CPU compile helpers fail to start (GPU helpers take over)
    cpu_miss               config ids whose first launch compiles (the helper's cubin missed)
    tflops                 {config_id: TFLOPS} overrides; else a deterministic made-up figure
    """

    def __init__(self, spec: dict):
        self.spec = dict(spec)
        self.delay = float(self.spec.get("delay_s", 0.01))
        self.compile_delay = float(self.spec.get("compile_delay_s", 0.01))
        time.sleep(float(self.spec.get("startup_s", 0.0)))
        self.phases = {"fake_startup": float(self.spec.get("startup_s", 0.0))}

    def hello(self) -> dict:
        return {"gpu": self.spec.get("gpu", "Fake GPU"), "arch": self.spec.get("arch", "sm_90"),
                "torch": None, "cuda": None, "cuda_tile": None, "runner": "fake",
                "pid": os.getpid()}

    def _hit(self, key: str, cid: str, case: str) -> bool:
        lst = self.spec.get(key) or ()
        return cid in lst or f"{cid}@{case}" in lst

    def run(self, job: dict) -> dict:
        cid, case = job["config_id"], job["case"]
        time.sleep(self.delay)
        if self._hit("hang", cid, case):
            time.sleep(10 ** 6)
        if self._hit("crash", cid, case):
            os._exit(13)
        if self._hit("compile_error", cid, case):
            return {"status": "compile_error",
                    "error": "TileCompilerError: fake: failed to compile Tile IR program"}
        if self._hit("launch_error", cid, case):
            return {"status": "launch_error", "error": "RuntimeError: fake: launch failed"}
        if self._hit("wrong", cid, case):
            return {"status": "wrong_result", "rel_l2_vs_sdpa": 0.7, "nonfinite": 0,
                    "error": "rel L2 vs SDPA 7.00e-01 > 2.00e-03"}
        if self._hit("nan", cid, case):
            return {"status": "wrong_result", "rel_l2_vs_sdpa": None, "nonfinite": 12,
                    "error": "12 NaN/Inf in the output"}
        tf = (self.spec.get("tflops") or {}).get(cid)
        if tf is None:
            h = zlib.crc32(f"{job['provider']}|{cid}|{case}".encode()) % 1000
            tf = 200.0 + 0.3 * h
        ms = job["flops"] / (tf * 1e12) * 1e3
        return {"status": "ok", "rel_l2_vs_sdpa": 3e-4, "nonfinite": 0, "first_call_s": 0.0,
                **self._first_launch(job), **stats([ms, ms * 1.01, ms * 0.99]), "runs": 3}

    def _first_launch(self, job: dict) -> dict:
        """cubin_disk_hits / cubin_compiles as the GPU runner reports them: a unit's first
        job in this worker finds the helper's cubin (1 hit), unless named in "cpu_miss"."""
        unit = job.get("unit_id")
        seen = self.__dict__.setdefault("_units_seen", set())
        if not unit or unit in seen:
            return {"cubin_disk_hits": 0, "cubin_compiles": 0}
        seen.add(unit)
        miss = self._hit("cpu_miss", job["config_id"], job["case"])
        return {"cubin_disk_hits": 0 if miss else 1, "cubin_compiles": 1 if miss else 0}

    #: set by main(): "compile-cpu" makes compile() answer cpu_unmapped units "unmapped"
    role = "worker"

    def compile(self, unit: dict) -> dict:
        cid, case = unit["config_id"], unit.get("case", "")
        if self.role == "compile-cpu" and self._hit("cpu_unmapped", cid, case):
            return {"status": "unmapped", "error": "fake: not modelled on stand-ins"}
        time.sleep(self.compile_delay)
        if self._hit("compile_hang", cid, case):
            time.sleep(10 ** 6)
        if self._hit("compile_crash", cid, case):
            os._exit(14)
        if self._hit("compile_error", cid, case):
            return {"status": "compile_error",
                    "error": "TileCompilerError: fake: failed to compile Tile IR program"}
        return {"status": "ok"}


# ------------------------------------------------------------------ GPU runner

class GpuRunner:
    """Checks and times configs with torch + cuTile on the local GPU, through the job's
    kernel family (``job["family"]``, default fmha_fwd): its GPU inputs, its peer
    reference (for attention, PyTorch SDPA with torch's own backend choice, rows that see
    no key zeroed), its kernel calls and peers; timed by spak.device.timing, the method
    `spak run` uses. One shape's inputs and reference are kept while consecutive jobs use
    it.
    """

    def __init__(self, opts: dict):
        # Start-up phases (seconds), in the hello: the 12-14 s start-ups of the 4x H200 run
        # (a lone restart took ~4 s) were one number; these tell which part grows when
        # 36 processes start together.
        self.phases: dict = {}
        t = time.monotonic()
        import torch
        self.phases["torch_import"] = time.monotonic() - t
        # "device" is for the CPU tests only (with torch.cuda's timing calls stubbed out)
        self.device = opts.get("device", "cuda")
        t = time.monotonic()
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU visible to PyTorch (torch.cuda.is_available() is "
                               "False); `spak sweep` needs one (the CPU loop is `spak sim`)")
        if self.device == "cuda":
            # The primary context now (start-up), not inside the first job's timing.
            torch.empty(1, device="cuda")
            torch.cuda.synchronize()
        self.phases["cuda_context"] = time.monotonic() - t
        t = time.monotonic()
        import cuda.tile as ct
        self.phases["cutile_import"] = time.monotonic() - t
        _CUBIN_COUNTER.install()           # first launches: disk-cache hits vs compiles
        self.torch = torch
        self.ct = ct
        self.opts = dict(opts)
        props = torch.cuda.get_device_properties(0)
        major, minor = torch.cuda.get_device_capability()
        self.arch = f"sm_{major}{minor}"
        self.l2_bytes = int(getattr(props, "L2_cache_size", 50 << 20) or (50 << 20))
        self.info = {"gpu": torch.cuda.get_device_name(), "arch": self.arch,
                     "torch": torch.__version__, "cuda": torch.version.cuda,
                     "cuda_tile": getattr(ct, "__version__", None), "runner": "gpu",
                     "sm_count": getattr(props, "multi_processor_count", None),
                     "l2_bytes": self.l2_bytes, "pid": os.getpid()}
        self._key = None
        self._data = None
        self.stream = torch.cuda.current_stream()

    def hello(self) -> dict:
        return self.info

    # -- inputs and reference
    def _inputs(self, fam, spec) -> dict:
        """The shape's input sets and peer reference (kept for the next job)."""
        from spak.device.timing import input_sets_for
        key = (fam.name, spec.case_id)
        if self._key == key:
            return self._data
        self._key, self._data = None, None
        self.torch.cuda.empty_cache()
        n_sets = input_sets_for(fam, spec, self.l2_bytes, self.opts.get("max_sets", 4))
        sets = fam.gpu_input_sets(spec, 0, n_sets, self.device)
        self._data = {"sets": sets, "ref": fam.peer_reference(spec, sets[0])}
        self._key = key
        return self._data

    def _check(self, fam, spec, outputs, ref) -> dict:
        """NaN/Inf anywhere, or an output off the peer reference by more than
        check_threshold, is a wrong result."""
        from spak.device.checks import nonfinite, rel_l2
        bad = sum(nonfinite(outputs[n]) for n in fam.outputs)
        rtol = check_threshold(fam, spec)
        rel = None if bad else max(rel_l2(outputs[n].float(), ref[n]) for n in fam.outputs)
        r = {"nonfinite": bad, "rel_l2_vs_sdpa": rel, "check_rtol": rtol}
        if bad:
            r.update(status="wrong_result", error=f"{bad} NaN/Inf in the output")
        elif not rel <= rtol:
            r.update(status="wrong_result", error=f"rel L2 vs SDPA {rel:.2e} > {rtol:.2e}")
        return r

    def _time(self, fn, n_sets: int) -> dict:
        """spak.device.timing.time_events with the sweep's options (warmup, batches,
        batch_ms per batch, max_per_batch)."""
        from spak.device.timing import time_events
        o = self.opts
        batches = int(o.get("batches", 5))
        st = time_events(fn, n_sets, warmup=int(o.get("warmup", 3)), batches=batches,
                         target_s=batches * float(o.get("batch_ms", 40.0)) / 1e3,
                         max_per_batch=int(o.get("max_per_batch", 100)))
        st["input_sets"] = n_sets
        return st

    # -- jobs
    def run(self, job: dict) -> dict:
        from spak import families
        from spak.device.failures import classify
        fam = families.get(job.get("family", families.DEFAULT))
        spec = fam.parse(job["case"])
        try:
            data = self._inputs(fam, spec)
        except Exception as exc:  # noqa: BLE001
            r = classify(exc)
            r["error"] = "preparing inputs/reference: " + r["error"]
            return r
        if job["provider"].startswith("spak-"):
            return self._run_ours(fam, job, spec, data)
        return self._run_peer(fam, job, spec, data)

    def _run_peer(self, fam, job, spec, data) -> dict:
        from spak.device.failures import classify
        torch = self.torch
        sets = data["sets"]
        peer = fam.peer_calls(spec, sets[0], names=[job["provider"]]).get(job["provider"])
        if peer is None:        # e.g. SDPA on a paged cache: no peer computes this function
            return {"status": "unsupported",
                    "error": f"{job['provider']} does not compute {spec.display}"}
        with peer.context():
            t0 = time.perf_counter()
            try:
                raw = peer.run(sets[0])
                torch.cuda.synchronize()
            except RuntimeError as exc:
                if isinstance(exc, torch.cuda.OutOfMemoryError):
                    return classify(exc)
                return {"status": "unsupported",
                        "error": str(exc).strip().splitlines()[0][:500]}
            r = {"status": "ok", "first_call_s": time.perf_counter() - t0}
            r.update(self._check(fam, spec, peer.conform(peer.outputs(raw)), data["ref"]))
            del raw
            r.update(self._time(lambda i: peer.run(sets[i]), len(sets)))
        return r

    def _launch(self, call) -> None:
        for L in call.launches:
            self.ct.launch(self.stream, L.grid, L.kernel, L.args)

    def _run_ours(self, fam, job, spec, data) -> dict:
        from spak.device.calls import first_tensor, shared_alloc
        from spak.device.failures import classify
        torch = self.torch
        cfg = job.get("config") or fam.default_config(spec, self.arch)
        sets = data["sets"]
        alloc = shared_alloc(first_tensor(sets[0]))
        try:
            calls = [fam.gpu_call(job["kernel"], spec, s, cfg, alloc=alloc) for s in sets]
        except (ValueError, TypeError) as exc:
            return {"status": "invalid_config", "error": f"{type(exc).__name__}: {exc}"}
        except torch.cuda.OutOfMemoryError as exc:
            return classify(exc)
        t0 = time.perf_counter()
        counts = _CUBIN_COUNTER.snapshot()
        try:
            self._launch(calls[0])
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 -- recorded, the sweep goes on
            return classify(exc)
        r = {"status": "ok", "first_call_s": time.perf_counter() - t0,
             "tiles_used": calls[0].tiles, "hints_used": calls[0].hints,
             **_CUBIN_COUNTER.since(counts)}
        r.update(self._check(fam, spec, calls[0].outputs, data["ref"]))
        if r["status"] != "ok":
            return r
        try:
            r.update(self._time(lambda i: self._launch(calls[i]), len(sets)))
        except Exception as exc:  # noqa: BLE001
            return {**r, **classify(exc)}
        return r

    def compile(self, unit: dict) -> dict:
        """JIT-compile one variant by launching it once on tiny arrays with the same
        specialisation as the real problem (the family's compile_call; see tiny_dim): the
        cubin lands in cuTile's disk cache, so the measuring worker's first launch only
        re-runs the front end."""
        from spak import families
        from spak.device.failures import classify
        fam = families.get(unit.get("family", families.DEFAULT))
        t0 = time.perf_counter()
        try:
            self._launch(fam.compile_call(unit, self.device))
            self.torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            r = classify(exc)
            r["seconds"] = time.perf_counter() - t0
            return r
        return {"status": "ok", "seconds": time.perf_counter() - t0}


class _CubinCounter:
    """Counts, in this process, the cubins cuTile found in its disk cache (a compile helper's,
    or an earlier run's) and those tileiras had to build: the sweep's proof that the
    helpers' cubins are the ones the workers' first launches look up. It wraps two private
    functions of cuda.tile._compile (compile_tile calls them by module global name); where
    they are missing the counts are absent (None), never wrong."""

    def __init__(self):
        self.hits = self.compiles = 0
        self.installed = False

    def install(self) -> None:
        if self.installed:
            return
        try:
            import cuda.tile._compile as cc
            lookup, build = cc.cache_lookup, cc.compile_cubin
        except (ImportError, AttributeError):
            return

        def cache_lookup(*a, **k):
            found = lookup(*a, **k)
            self.hits += found is not None
            return found

        def compile_cubin(*a, **k):
            self.compiles += 1
            return build(*a, **k)
        cc.cache_lookup, cc.compile_cubin = cache_lookup, compile_cubin
        self.installed = True

    def snapshot(self) -> tuple:
        return self.hits, self.compiles

    def since(self, snap: tuple) -> dict:
        if not self.installed:
            return {}
        return {"cubin_disk_hits": self.hits - snap[0], "cubin_compiles": self.compiles - snap[1]}


_CUBIN_COUNTER = _CubinCounter()


#: Faults injected into one GPU's worker, for testing a multi-GPU sweep on real hardware
#: (the GPU script of issue 36) and on the CPU: JSON {GPU: {"hang": [...], "crash": [...]}},
#: GPU a CUDA_VISIBLE_DEVICES entry ("1"), lists of config ids or "ID@CASE" as FakeRunner's.
#: A "hang" job sleeps in the worker (the driver's --timeout kills it); a "crash" exits.
#: "once": a file path; the first fault creates it and no fault fires while it exists (so
#: a fresh worker on that GPU, or the retry, runs the job normally).
FAULTS_ENV = "SPAK_SWEEP_FAULTS"


class FaultInjector:
    """Wraps a runner; the jobs named for this worker's GPU in $SPAK_SWEEP_FAULTS hang or
    crash before running."""

    def __init__(self, runner, faults: dict):
        self.runner = runner
        self.faults = faults

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def _hit(self, key: str, job: dict) -> bool:
        lst = self.faults.get(key) or ()
        return job["config_id"] in lst or f"{job['config_id']}@{job['case']}" in lst

    def _fire(self) -> bool:
        once = self.faults.get("once")
        if not once:
            return True
        try:
            os.close(os.open(once, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            return True
        except FileExistsError:
            return False

    def run(self, job: dict) -> dict:
        if self._hit("hang", job) and self._fire():
            time.sleep(10 ** 6)
        if self._hit("crash", job) and self._fire():
            os._exit(13)
        return self.runner.run(job)


def with_faults(runner, env=None):
    """The runner, wrapped in a FaultInjector when $SPAK_SWEEP_FAULTS names this worker's
    GPU (its CUDA_VISIBLE_DEVICES); a malformed value is a ValueError."""
    env = os.environ if env is None else env
    text = env.get(FAULTS_ENV, "").strip()
    if not text:
        return runner
    try:
        faults = json.loads(text)
        if not isinstance(faults, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise ValueError(f"${FAULTS_ENV} must be JSON {{GPU: {{\"hang\": [...], "
                         f"\"crash\": [...]}}}}: {e}") from None
    mine = faults.get(env.get("CUDA_VISIBLE_DEVICES", ""))
    return FaultInjector(runner, mine) if mine else runner


def make_runner(spec: str, opts: dict):
    """"gpu" -> GpuRunner(opts); "fake:<json file or inline JSON>" -> FakeRunner."""
    if spec == "gpu":
        return GpuRunner(opts)
    if spec.startswith("fake"):
        text = spec[5:] if spec.startswith("fake:") else "{}"
        text = text.strip() or "{}"
        if not text.startswith("{"):
            with open(text) as f:
                text = f.read()
        return FakeRunner(json.loads(text))
    raise ValueError(f"unknown runner {spec!r}: expected 'gpu' or 'fake:SPEC'")


# ------------------------------------------------------------------ process plumbing

def _die_with_parent() -> None:
    """Ask Linux to SIGKILL this process when its parent dies (a killed sweep leaves no
    orphan holding the GPU)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)          # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001
        pass




def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m spak.tune.worker")
    ap.add_argument("--fd", type=int, required=True, help="file descriptor for replies")
    ap.add_argument("--role", choices=("worker", "compile", "compile-cpu"), default="worker")
    ap.add_argument("--runner", default="gpu")
    ap.add_argument("--opts", default="{}", help="timing options, JSON")
    ap.add_argument("--parent", type=int, default=None, help="parent pid (exit if it dies)")
    main_at = time.monotonic()        # CLOCK_MONOTONIC: the parent's clock too (one host)
    ns = ap.parse_args(argv)
    _die_with_parent()
    if ns.parent is not None and os.getppid() != ns.parent:
        return 0                                          # parent died before prctl
    if ns.role != "worker":
        try:
            # the measuring workers and the driver come first: at nice 5, 60 CPU helpers (and
            # their tileiras children) on 64 cores slowed each worker's host side and the
            # driver's dispatch (4x H200, 2026-11-28 run 2: a GPU's jobs took 31.7 s wall for
            # 28.0 s busy, first launches 199 ms against 164 ms alone); 19 is the lowest
            os.nice(19)
        except OSError:
            pass
    out = os.fdopen(ns.fd, "w", buffering=1)

    def reply(obj):
        out.write(json.dumps(_jsonable(obj), allow_nan=False) + "\n")
        out.flush()

    try:
        if ns.role == "compile-cpu" and ns.runner == "gpu":
            from spak.tune.cpu_compile import CpuCompiler
            runner = CpuCompiler(block_torch=True)      # no torch, no CUDA context
        else:
            runner = make_runner(ns.runner, json.loads(ns.opts))
            runner.role = ns.role
            if ns.role == "compile-cpu" and (getattr(runner, "spec", None) or {}).get(
                    "cpu_setup_error"):
                raise RuntimeError("fake: the CPU compile helper cannot start")
        if ns.role == "worker":
            runner = with_faults(runner)
    except Exception as exc:  # noqa: BLE001 -- the parent prints it and stops
        reply({"fatal_setup": f"{type(exc).__name__}: {exc}"})
        return 2
    ready_at = time.monotonic()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        op = msg.get("op")
        if op == "exit":
            break
        if op == "hello":
            reply({"hello": {**runner.hello(), "startup": {
                "main_at": main_at, "ready_at": ready_at,
                "phases": dict(getattr(runner, "phases", None) or {})}}})
        elif op == "job":
            t0 = time.perf_counter()
            try:
                r = runner.run(msg["job"])
            except Exception as exc:  # noqa: BLE001 -- never lose the worker to one job
                r = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            r["wall_s"] = time.perf_counter() - t0
            reply({"result": r})
            if r.get("fatal"):
                return 3
        elif op == "compile":
            unit = msg["unit"]
            try:
                r = runner.compile(unit)
            except Exception as exc:  # noqa: BLE001
                r = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
            r["unit_id"] = unit["unit_id"]
            reply({"compiled": r})
            if r.get("fatal"):
                return 3
        else:
            reply({"error": f"unknown op {op!r}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
