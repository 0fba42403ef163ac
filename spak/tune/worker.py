"""The sweeper's child processes: a measuring worker and compile helpers (see spak.tune.sweep).

    python -m spak.tune.worker --fd N [--role worker|compile] [--runner gpu|fake:SPEC]

Commands arrive on stdin, one JSON object a line; replies go to file descriptor N, one
JSON object a line (stdout and stderr stay free for cuTile's and torch's own chatter):

    {"op": "hello"}               -> {"hello": {gpu, arch, ...}}
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
import math
import os
import signal
import sys
import time
import zlib

from spak.core.stats import stats
from spak.results.jsonl import jsonable as _jsonable

__all__ = ["STATUSES", "CHECK_RTOL", "check_threshold", "GpuRunner", "FakeRunner",
           "make_runner", "main", "tiny_dim", "stats"]

#: Every status a result line may have. Written by the worker: ok, compile_error,
#: launch_error, wrong_result, invalid_config, unsupported (an SDPA backend refused the
#: shape), oom, error. Written by the parent: timeout, crash.
STATUSES = ("ok", "compile_error", "launch_error", "wrong_result", "invalid_config",
            "unsupported", "oom", "error", "timeout", "crash")

#: Relative-L2 limit of a config's output against PyTorch SDPA's. Both are compared with the
#: float64 gates of spak.core.metrics (1e-3 fp16, 8e-3 bf16): a correct kernel is within the gate
#: of float64, and so is SDPA, so by the triangle inequality two correct outputs differ by at
#: most twice the gate. A wrong tile config (a skipped or doubled key tile, a bad mask edge)
#: is off by 1e-1 or more; NaN/Inf anywhere fails regardless.
CHECK_RTOL = {"fp16": 2e-3, "bf16": 1.6e-2}


def check_threshold(dtype: str) -> float:
    return CHECK_RTOL[dtype]


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
    compile_delay_s        seconds each compile unit takes (default 0.01)
    compile_error, launch_error, wrong, nan, hang, crash, compile_hang, compile_crash:
                           lists of config ids ("64x128/occ2"), or "ID@CASE" for one shape
                           ("default" is the default tiles; "sdpa-flash" etc. the providers)
    tflops                 {config_id: TFLOPS} overrides; else a deterministic made-up figure
    """

    def __init__(self, spec: dict):
        self.spec = dict(spec)
        self.delay = float(self.spec.get("delay_s", 0.01))
        self.compile_delay = float(self.spec.get("compile_delay_s", 0.01))

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
                **stats([ms, ms * 1.01, ms * 0.99]), "runs": 3}

    def compile(self, unit: dict) -> dict:
        cid, case = unit["config_id"], unit.get("case", "")
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
    """Checks and times configs with torch + cuTile on the local GPU.

    Inputs are N(0, 1), seeded per case; one shape's inputs are kept while consecutive jobs
    use it. The reference is PyTorch SDPA (default backend choice) on the first input set,
    with NaN rows (fully masked) zeroed, as SPAK's kernels write zeros there.
    """

    def __init__(self, opts: dict):
        import torch
        # "device" is for the CPU tests only (with torch.cuda's timing calls stubbed out)
        self.device = opts.get("device", "cuda")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA GPU visible to PyTorch (torch.cuda.is_available() is "
                               "False); `spak sweep` needs one (the CPU loop is `spak sim`)")
        import cuda.tile as ct
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
        self._case = None
        self._data = None
        self.stream = torch.cuda.current_stream()

    def hello(self) -> dict:
        return self.info

    # -- inputs and reference
    def _inputs(self, spec):
        if self._case == spec.case_id:
            return self._data
        torch = self.torch
        self._case, self._data = None, None
        torch.cuda.empty_cache()
        dt = torch.float16 if spec.dtype == "fp16" else torch.bfloat16
        set_bytes = 2 * (spec.B * spec.Hq * spec.Sq * spec.D + 2 * spec.B * spec.Hkv * spec.Sk
                         * spec.D)
        n_sets = int(min(self.opts.get("max_sets", 4),
                         max(1, math.ceil(3 * self.l2_bytes / max(set_bytes, 1)))))
        sets = []
        for i in range(n_sets):
            g = torch.Generator(device=self.device).manual_seed(
                (zlib.crc32(spec.case_id.encode()) * 1009 + i) % (2 ** 63))
            sets.append(tuple(torch.randn(shape, device=self.device, dtype=dt, generator=g)
                              for shape in (spec.q_shape, spec.kv_shape, spec.kv_shape)))
        scale = 1.0 / math.sqrt(spec.D)
        sdpa_mask, sdpa_causal = self._sdpa_args(spec)
        q, k, v = sets[0]
        ref = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=sdpa_mask, is_causal=sdpa_causal, scale=scale,
            **({"enable_gqa": True} if spec.Hq != spec.Hkv else {}))
        ref = torch.nan_to_num(ref.float(), nan=0.0)
        self._data = {"sets": sets, "ref": ref, "scale": scale, "sdpa_mask": sdpa_mask,
                      "sdpa_causal": sdpa_causal}
        self._case = spec.case_id
        return self._data

    def _sdpa_args(self, spec):
        """(attn_mask, is_causal) for SDPA with SPAK's bottom-right causal convention."""
        torch = self.torch
        if not spec.causal:
            return None, False
        if spec.Sq == spec.Sk:
            return None, True
        i = torch.arange(spec.Sq, device=self.device)[:, None]
        j = torch.arange(spec.Sk, device=self.device)[None, :]
        return j <= i + (spec.Sk - spec.Sq), False

    def _rel_l2(self, out, ref) -> float:
        torch = self.torch
        num = float(torch.linalg.vector_norm((out.float() - ref).double()))
        den = float(torch.linalg.vector_norm(ref.double()))
        if den == 0.0:
            return 0.0 if num == 0.0 else math.inf
        return num / den

    def _check(self, out, ref, dtype) -> dict:
        nonfinite = int((~self.torch.isfinite(out)).sum())
        rel = self._rel_l2(out, ref) if nonfinite == 0 else None
        r = {"nonfinite": nonfinite, "rel_l2_vs_sdpa": rel,
             "check_rtol": check_threshold(dtype)}
        if nonfinite:
            r.update(status="wrong_result", error=f"{nonfinite} NaN/Inf in the output")
        elif not rel <= check_threshold(dtype):
            r.update(status="wrong_result",
                     error=f"rel L2 vs SDPA {rel:.2e} > {check_threshold(dtype):.2e}")
        return r

    # -- timing
    def _time(self, fn, n_sets: int) -> dict:
        """Median of per-batch mean times (ms): batches of back-to-back calls between one
        CUDA event pair, each batch queued behind a short GPU sleep so the CPU's launch
        overhead is not timed; inputs rotate over n_sets."""
        torch = self.torch
        o = self.opts
        for i in range(int(o.get("warmup", 3))):
            fn(i % n_sets)
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn(0)
        e.record()
        e.synchronize()
        est_ms = max(s.elapsed_time(e), 1e-3)
        per_batch = int(min(o.get("max_per_batch", 100),
                            max(1, round(o.get("batch_ms", 40.0) / est_ms))))
        sleep = getattr(torch.cuda, "_sleep", None)
        samples = []
        k = 0
        for _ in range(int(o.get("batches", 5))):
            if sleep is not None:   # ~50 us of launch work per call, at most 20 ms
                sleep(int(min(20e-3, 50e-6 * per_batch) * 1.4e9))
            s.record()
            for _ in range(per_batch):
                fn(k % n_sets)
                k += 1
            e.record()
            e.synchronize()
            samples.append(s.elapsed_time(e) / per_batch)
        st = stats(samples)
        st.update(runs=per_batch * len(samples), batches=len(samples), per_batch=per_batch,
                  input_sets=n_sets)
        return st

    # -- errors
    def _classify(self, exc: BaseException) -> dict:
        torch = self.torch
        msg = f"{type(exc).__name__}: {exc}".strip()
        if len(msg) > 4000:
            msg = msg[:4000] + " ..."
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
            return {"status": "oom", "error": msg.splitlines()[0]}
        compile_err = False
        try:
            from cuda.tile._exception import TileError
            compile_err = isinstance(exc, TileError)
        except ImportError:
            pass
        if not compile_err:
            try:
                from spak.device import env as gpu_env
                compile_err = gpu_env.is_compile_error(exc)
            except Exception:  # noqa: BLE001
                pass
        if compile_err:
            return {"status": "compile_error", "error": msg}
        r = {"status": "launch_error", "error": msg}
        try:                               # a sticky CUDA error poisons the context
            torch.cuda.synchronize()
        except Exception as e2:  # noqa: BLE001
            r["fatal"] = True
            r["error"] += f"\n(CUDA context lost: {type(e2).__name__}: {e2})"
        return r

    # -- jobs
    def run(self, job: dict) -> dict:
        from spak.attention.problems import parse_spec
        spec = parse_spec(job["case"])
        try:
            data = self._inputs(spec)
        except Exception as exc:  # noqa: BLE001
            r = self._classify(exc)
            r["error"] = "preparing inputs/reference: " + r["error"]
            return r
        if job["provider"].startswith("sdpa-"):
            return self._run_sdpa(job, spec, data)
        return self._run_ours(job, spec, data)

    def _run_sdpa(self, job, spec, data) -> dict:
        torch = self.torch
        from torch.nn.attention import SDPBackend, sdpa_kernel
        name = job["provider"][5:]
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
                   "efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "math": SDPBackend.MATH}[name]
        F = torch.nn.functional.scaled_dot_product_attention
        kw = dict(attn_mask=data["sdpa_mask"], is_causal=data["sdpa_causal"],
                  scale=data["scale"])
        if spec.Hq != spec.Hkv:
            kw["enable_gqa"] = True
        sets = data["sets"]
        with sdpa_kernel([backend]):
            t0 = time.perf_counter()
            try:
                out = F(*sets[0], **kw)
                torch.cuda.synchronize()
            except RuntimeError as exc:
                if isinstance(exc, torch.cuda.OutOfMemoryError):
                    return self._classify(exc)
                return {"status": "unsupported",
                        "error": str(exc).strip().splitlines()[0][:500]}
            first = time.perf_counter() - t0
            r = {"status": "ok", "first_call_s": first}
            r.update(self._check(torch.nan_to_num(out, nan=0.0), data["ref"], spec.dtype))
            del out
            r.update(self._time(lambda i: F(*sets[i], **kw), len(sets)))
        return r

    def _run_ours(self, job, spec, data) -> dict:
        torch = self.torch
        from spak.gpu.plan import default_tiles, plan_fmha
        from spak.gpu.variants import apply_hints, split_config
        cfg = job.get("config") or default_tiles(spec.D, self.arch, spec.causal)
        try:
            tiles, hints = split_config(cfg)
        except ValueError as exc:
            return {"status": "invalid_config", "error": f"ValueError: {exc}"}
        sets = data["sets"]
        ws = {}

        def alloc(shape, kind):   # shared workspaces: the timed plans run one at a time
            key = (tuple(int(n) for n in shape), kind)
            if key not in ws:
                dt = torch.float32 if kind == "float32" else sets[0][0].dtype
                ws[key] = torch.empty(key[0], dtype=dt, device=self.device)
            return ws[key]
        try:
            outs = [torch.empty((spec.B, spec.Hq, spec.Sq, spec.D), dtype=q.dtype,
                                device=self.device) for q, _, _ in sets]
            plans = [apply_hints(plan_fmha(job["kernel"], q, k, v, o, causal=spec.causal,
                                           scale=data["scale"], tiles=tiles, alloc=alloc),
                                 hints) for (q, k, v), o in zip(sets, outs)]
        except (ValueError, TypeError) as exc:
            return {"status": "invalid_config", "error": f"{type(exc).__name__}: {exc}"}
        except torch.cuda.OutOfMemoryError as exc:
            return self._classify(exc)
        stream = self.stream
        ct = self.ct

        def call(i):
            for L in plans[i]:
                ct.launch(stream, L.grid, L.kernel, L.args)
        outs[0].fill_(float("nan"))          # poison: an unwritten element stays NaN
        t0 = time.perf_counter()
        try:
            call(0)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 -- recorded, the sweep goes on
            return self._classify(exc)
        r = {"status": "ok", "first_call_s": time.perf_counter() - t0, "tiles_used": tiles,
             "hints_used": hints}
        r.update(self._check(outs[0], data["ref"], spec.dtype))
        if r["status"] != "ok":
            return r
        try:
            r.update(self._time(call, len(sets)))
        except Exception as exc:  # noqa: BLE001
            return {**r, **self._classify(exc)}
        return r

    def compile(self, unit: dict) -> dict:
        """JIT-compile one variant by launching it once on tiny arrays with the same
        specialisation as the real problem (see tiny_dim): the cubin lands in cuTile's disk
        cache, so the measuring worker's first launch only re-runs the front end."""
        torch = self.torch
        from spak.gpu.plan import plan_fmha
        from spak.gpu.variants import apply_hints, split_config
        dt = torch.float16 if unit["dtype"] == "fp16" else torch.bfloat16
        t0 = time.perf_counter()
        try:
            tiles, hints = split_config(unit["config"])
            q = torch.randn(unit["q"], device=self.device, dtype=dt)
            k = torch.randn(unit["k"], device=self.device, dtype=dt)
            v = torch.randn(unit["k"], device=self.device, dtype=dt)
            o = torch.empty(unit["q"], device=self.device, dtype=dt)

            def alloc(shape, kind):
                return torch.empty(tuple(shape), device=self.device,
                                   dtype=torch.float32 if kind == "float32" else dt)
            plan = apply_hints(plan_fmha(unit["kernel"], q, k, v, o, causal=unit["causal"],
                                         scale=1.0 / math.sqrt(unit["q"][-1]), tiles=tiles,
                                         alloc=alloc), hints)
            for L in plan:
                self.ct.launch(self.stream, L.grid, L.kernel, L.args)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001
            r = self._classify(exc)
            r["seconds"] = time.perf_counter() - t0
            return r
        return {"status": "ok", "seconds": time.perf_counter() - t0}


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
    ap.add_argument("--role", choices=("worker", "compile"), default="worker")
    ap.add_argument("--runner", default="gpu")
    ap.add_argument("--opts", default="{}", help="timing options, JSON")
    ap.add_argument("--parent", type=int, default=None, help="parent pid (exit if it dies)")
    ns = ap.parse_args(argv)
    _die_with_parent()
    if ns.parent is not None and os.getppid() != ns.parent:
        return 0                                          # parent died before prctl
    if ns.role == "compile":
        try:
            os.nice(5)                                    # the measuring worker comes first
        except OSError:
            pass
    out = os.fdopen(ns.fd, "w", buffering=1)

    def reply(obj):
        out.write(json.dumps(_jsonable(obj), allow_nan=False) + "\n")
        out.flush()

    try:
        runner = make_runner(ns.runner, json.loads(ns.opts))
    except Exception as exc:  # noqa: BLE001 -- the parent prints it and stops
        reply({"fatal_setup": f"{type(exc).__name__}: {exc}"})
        return 2
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        msg = json.loads(line)
        op = msg.get("op")
        if op == "exit":
            break
        if op == "hello":
            reply({"hello": runner.hello()})
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
