"""Run pytest on a list of node ids with a stall watchdog: a test that keeps the process in
one long C call (a torch reference on a large shape) cannot be interrupted by a signal, so
when no output comes for STALL seconds the child is killed, that test recorded as TIMEOUT,
and pytest restarted on the ids not yet run. Writes OUT.tsv (id, outcome, reason) and
OUT.log (all output).

    python ci/pytest_watch.py IDS_FILE OUT --stall 60 -- -p spak.sim.pytest_plugin ...
"""
import argparse
import os
import re
import select
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
OUTCOME = re.compile(r"^(tests/\S.*?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
REASON = re.compile(r"^(FAILED|ERROR|SKIPPED) (?:\[\d+\] )?(tests/\S.*?)(?: - (.*))?$")


def _run_once(ids, args, stall, log):
    """Run pytest on ids; return ({id: outcome}, {id: reason}, id that stalled or None)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("\n".join(ids))
    cmd = [sys.executable, "-u", os.path.join(HERE, "pytest_ids.py"), f.name, "-v", "-rA",
           "--tb=line"] + args
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    buf, outcomes, reasons, last = b"", {}, {}, time.time()
    while True:
        r, _, _ = select.select([p.stdout], [], [], 5.0)
        if r:
            chunk = os.read(p.stdout.fileno(), 65536)
            if not chunk:
                break
            last = time.time()
            log.write(chunk.decode(errors="replace"))
            log.flush()
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in (x.decode(errors="replace") for x in lines):
                m = OUTCOME.match(line)
                if m:
                    outcomes[m.group(1)] = m.group(2)
                m = REASON.match(line)
                if m:
                    reasons[m.group(2)] = (m.group(3) or "").strip()
        elif time.time() - last > stall:
            p.kill()
            p.wait()
            pending = [i for i in ids if i not in outcomes]
            return outcomes, reasons, (pending[0] if pending else None)
    p.wait()
    os.unlink(f.name)
    return outcomes, reasons, None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("ids")
    ap.add_argument("out")
    ap.add_argument("--stall", type=float, default=60.0)
    argv = sys.argv[1:] if argv is None else argv
    rest = argv[argv.index("--") + 1:] if "--" in argv else []
    a = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    a.pytest_args = rest
    ids = [x.strip() for x in open(a.ids) if "::" in x]
    done, reasons = {}, {}
    with open(a.out + ".log", "w") as log:
        while True:
            todo = [i for i in ids if i not in done]
            if not todo:
                break
            outcomes, why, stalled = _run_once(todo, a.pytest_args, a.stall, log)
            done.update(outcomes)
            reasons.update(why)
            if stalled is None:
                for i in todo:
                    done.setdefault(i, "NOTRUN")
                break
            done[stalled] = "TIMEOUT"
            reasons[stalled] = f"no progress for {a.stall:g} s (killed)"
            log.write(f"\n[pytest_watch] {stalled}: TIMEOUT, restarting\n")
    with open(a.out + ".tsv", "w") as f:
        for i in ids:
            f.write(f"{i}\t{done.get(i, 'NOTRUN')}\t{reasons.get(i, '')}\n")
    counts = {}
    for i in ids:
        counts[done.get(i, "NOTRUN")] = counts.get(done.get(i, "NOTRUN"), 0) + 1
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0 if counts.get("FAILED", 0) + counts.get("ERROR", 0) + counts.get("TIMEOUT", 0) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
