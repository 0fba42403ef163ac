"""What a failure on the GPU becomes: a row's "error" text (`spak run`) or a sweep result's
status (`classify`: oom, compile_error, launch_error, with "fatal" when the CUDA context
is lost). torch and cuTile are imported inside the functions.
"""
from __future__ import annotations

__all__ = ["failure_text", "classify", "is_oom", "MAX_ERROR_CHARS"]

#: Longest error text a sweep result carries (a compiler's log can run to megabytes).
MAX_ERROR_CHARS = 4000


def is_oom(exc: BaseException) -> bool:
    """A CUDA out-of-memory error (torch.cuda.OutOfMemoryError), by name: no torch import."""
    return type(exc).__name__ == "OutOfMemoryError"


def _free_cached_memory() -> None:
    try:
        import torch
        torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001 -- best effort
        pass


def failure_text(exc: BaseException) -> str:
    """An exception as a row's "error"; a CUDA out-of-memory error also frees torch's cached
    blocks, so the next shape starts with what memory is left."""
    if is_oom(exc):
        _free_cached_memory()
        first = (str(exc).strip().splitlines() or [""])[0]
        return f"OutOfMemoryError: {first}"
    return f"{type(exc).__name__}: {exc}"


def _is_compile_error(exc: BaseException) -> bool:
    """cuTile's own errors (TileError: compile-time checks, the compiler) or a compiler
    set-up failure spak.device.env recognises."""
    from spak.device import env as gpu_env
    try:
        from cuda.tile._exception import TileError
    except ImportError:
        TileError = ()
    return isinstance(exc, TileError) or gpu_env.is_compile_error(exc)


def classify(exc: BaseException) -> dict:
    """{"status": "oom" | "compile_error" | "launch_error", "error": text}; a launch error
    after which the CUDA context is unusable (a sticky error: the next synchronize fails
    too) also carries "fatal": True, so the sweep starts a fresh worker."""
    import torch
    msg = f"{type(exc).__name__}: {exc}".strip()
    if len(msg) > MAX_ERROR_CHARS:
        msg = msg[:MAX_ERROR_CHARS] + " ..."
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        _free_cached_memory()
        return {"status": "oom", "error": msg.splitlines()[0]}
    if _is_compile_error(exc):
        return {"status": "compile_error", "error": msg}
    r = {"status": "launch_error", "error": msg}
    try:                               # a sticky CUDA error poisons the context
        torch.cuda.synchronize()
    except Exception as e2:  # noqa: BLE001
        r["fatal"] = True
        r["error"] += f"\n(CUDA context lost: {type(e2).__name__}: {e2})"
    return r
