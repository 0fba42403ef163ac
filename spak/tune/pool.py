"""The sweeper's child processes, seen from the driver: one `python -m spak.tune.worker`
subprocess each (a measuring worker or a compile helper), spoken to in JSON lines.

Commands go to the child's stdin; replies come back on a private pipe (its stdout and
stderr go to the sweep's log, free for cuTile's and torch's own chatter). Each child is
the leader of its own process group, so a kill takes its compiler subprocesses too; it
dies with the driver (the worker asks Linux for PR_SET_PDEATHSIG).
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

__all__ = ["WorkerProcess", "log_tail"]

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """One worker subprocess. ``role`` "worker" (checks and times jobs) or "compile" (a
    compile helper); ``env`` adds to the inherited environment (e.g. CUDA_VISIBLE_DEVICES
    to pin it to one GPU). Replies are read when the selector reports the pipe readable
    (``on_readable``) and queued for ``pop``."""

    def __init__(self, role: str, runner: str, opts: dict, log, sel: selectors.BaseSelector,
                 env: Optional[dict] = None):
        r, w = os.pipe()
        full_env = dict(os.environ)
        full_env["PYTHONPATH"] = str(ROOT) + (os.pathsep + full_env["PYTHONPATH"]
                                              if full_env.get("PYTHONPATH") else "")
        full_env.setdefault("PYTHONUNBUFFERED", "1")
        full_env.update(env or {})
        cmd = [sys.executable, "-m", "spak.tune.worker", "--fd", str(w), "--role", role,
               "--runner", runner, "--opts", json.dumps(opts), "--parent", str(os.getpid())]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=log, stderr=log,
                                     pass_fds=(w,), start_new_session=True, env=full_env,
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

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return not self.eof and self.proc.poll() is None

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
        try:
            self.proc.stdin.close()
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


def log_tail(path: Optional[Path], n: int = 15) -> str:
    """The last ``n`` non-blank lines of the log (at most its last 8 KiB)."""
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
