"""TileGym tests/ops outcomes on the GPU joined with the CPU interpreter-mode outcomes of the
same node ids; issue 37. Three uses:

    python tools/tilegym_compare.py order ALL_IDS          # the run order (stdout)
    python tools/tilegym_compare.py join DIR               # DIR/{gpu,cpu}_*.tsv of one run
    python tools/tilegym_compare.py OUTDIR junit_1.xml [junit_2.xml ...]   # GPU junit vs CPU table

`order` and `join` serve tools/tilegym_suite.sh (both sides in one run, tsv rows written by
tools/pytest_queue.py); see their functions. The junit form, below, joins an earlier GPU run
with the per-test table of results/tilegym_interpreter.md:

Writes OUTDIR/outcomes.tsv (GPU outcome, seconds, node id: tab-separated, because TileGym's ids
contain spaces, e.g. "[cutile-(16, 4)-...]" and "GQA group_size=4") and OUTDIR/compare.tsv
(node id, GPU outcome, CPU outcome, CPU reason) and prints the counts: of the tests that pass on
the GPU, how many pass on the CPU, and every disagreement. CPU only; reads what the GPU run wrote.
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

CPU_TABLE = os.path.join(os.path.dirname(__file__), "..", "results", "tilegym_interpreter.md")


def junit_outcomes(paths):
    """[(node id, outcome, seconds)] in file order. pytest writes an empty <testcase/> (no
    classname) for the test a SIGINT interrupted: that one did not finish and is left out."""
    rows = []
    for path in paths:
        for tc in ET.parse(path).getroot().iter("testcase"):
            cls = tc.get("classname")
            if cls is None:
                continue
            *mod, klass = cls.split(".")
            nid = "/".join(mod) + ".py::" + klass + "::" + tc.get("name")
            out = "PASSED"
            for child in tc:
                if child.tag == "skipped":
                    out = "SKIPPED"
                elif child.tag == "failure":
                    out = "FAILED"              # pytest's word, as in the CPU table
                elif child.tag == "error":
                    out = "ERROR"
            rows.append((nid, out, float(tc.get("time") or 0.0)))
    return rows


def cpu_outcomes(path=CPU_TABLE):
    """{node id: (outcome, reason)} from the markdown table rows `| `id` | OUTCOME | reason |`."""
    table = {}
    pat = re.compile(r"^\| `(.+?)` \| ([A-Z]+) \| (.*) \|$")
    with open(path) as f:
        for line in f:
            m = pat.match(line.rstrip("\n"))
            if m:
                table["tests/ops/" + m.group(1)] = (m.group(2), m.group(3).strip())
    return table


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "order":
        return order_main(argv[1:])
    if argv and argv[0] == "join":
        return join_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir")
    ap.add_argument("junit", nargs="+")
    ap.add_argument("--cpu", default=CPU_TABLE, help="markdown file with the CPU per-test table")
    a = ap.parse_args(argv)
    gpu = junit_outcomes(a.junit)
    cpu = cpu_outcomes(a.cpu)
    os.makedirs(a.outdir, exist_ok=True)
    with open(os.path.join(a.outdir, "outcomes.tsv"), "w") as f:
        f.write("gpu_outcome\tseconds\tnode_id\n")
        for nid, out, t in gpu:
            f.write(f"{out}\t{t:.3f}\t{nid}\n")
    counts = {}
    with open(os.path.join(a.outdir, "compare.tsv"), "w") as f:
        f.write("node_id\tgpu\tcpu\tcpu_reason\n")
        for nid, out, _ in gpu:
            c, why = cpu.get(nid, ("NOT-RUN", "no CPU record"))
            f.write(f"{nid}\t{out}\t{c}\t{why}\n")
            counts[(out, c)] = counts.get((out, c), 0) + 1
    print(f"{len(gpu)} tests ran on the GPU")
    for (g, c), n in sorted(counts.items()):
        print(f"  GPU {g:8s} CPU {c:8s} {n}")
    passed = [(nid, cpu.get(nid, ("NOT-RUN", ""))) for nid, out, _ in gpu if out == "PASSED"]
    both = sum(1 for _, (c, _w) in passed if c == "PASSED")
    if passed:
        print(f"pass on the GPU: {len(passed)}; of these pass on the CPU: {both} "
              f"({100.0 * both / len(passed):.1f}%)")
    for nid, out, _ in gpu:
        c, why = cpu.get(nid, ("NOT-RUN", "no CPU record"))
        if c != out:
            print(f"  differs: GPU {out}, CPU {c}: {nid}  ({why})")
    return 0


# -- order / join: tools/tilegym_suite.sh (both sides in one run) --------------------------

HERE = os.path.dirname(os.path.abspath(__file__))
GPU_BEFORE = os.path.join(HERE, "..", "results", "tilegym-gpu-h200-2026-11-28", "outcomes.tsv")
CI_IDS = os.path.join(HERE, "..", "ci", "tilegym_ci.txt")


def _read_ids(path):
    with open(path) as f:
        return [line.strip() for line in f if "::" in line]


def run_order(ids, gpu_before=GPU_BEFORE, cpu_table=CPU_TABLE, ci_ids=CI_IDS):
    """The ids in run order: what passed on the GPU before first (each must be measured on
    the CPU: the target's denominator), then what the CPU sample passed or skipped and CI's
    subset (known fast), the other correctness tests, the sample's CPU failures/timeouts
    (slow there), then test_perf (full-size benchmarks; 0 of 7 finished on a CPU in 60-90 s).
    Collection order within a group."""
    gpu_pass = set()
    if os.path.exists(gpu_before):
        with open(gpu_before) as f:
            gpu_pass = {r.split("\t")[2] for r in f.read().splitlines()[1:]
                        if r.startswith("PASSED\t")}
    cpu = cpu_outcomes(cpu_table) if os.path.exists(cpu_table) else {}
    fast = set(_read_ids(ci_ids)) if os.path.exists(ci_ids) else set()
    fast |= {i for i, (o, _w) in cpu.items() if o in ("PASSED", "SKIPPED")}

    def group(nid):
        perf = "::test_perf" in nid
        if nid in gpu_pass:
            return 0
        if nid in fast:
            return 1 if not perf else 4
        if nid in cpu:              # failed / timed out on the CPU before
            return 3 if not perf else 5
        return 2 if not perf else 5
    pos = {nid: i for i, nid in enumerate(ids)}
    return sorted(dict.fromkeys(ids), key=lambda n: (group(n), pos[n]))


def order_main(argv):
    if len(argv) != 1:
        print("usage: tilegym_compare.py order ALL_IDS", file=sys.stderr)
        return 2
    for nid in run_order(_read_ids(argv[0])):
        print(nid)
    return 0


def read_tsvs(paths):
    """{id: (outcome, seconds, reason)} from tools/pytest_queue.py rows. An id with only a
    STARTED row was running when its process was stopped: KILLED (not finished)."""
    res = {}
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                parts = line.rstrip("\n").split("\t")
                if len(parts) < 3:
                    continue
                out, secs, nid = parts[0], float(parts[1] or 0), parts[2]
                why = parts[3] if len(parts) > 3 else ""
                if out == "STARTED":
                    res.setdefault(nid, ("KILLED", 0.0, "still running at the time bound"))
                else:
                    if out == "FAILED" and "SPAK_SIM_TEST_TIMEOUT" in why:
                        out = "TIMEOUT"
                    res[nid] = (out, secs, why)
    return res


def _count(rows):
    c = {}
    for r in rows:
        c[r] = c.get(r, 0) + 1
    return " ".join(f"{k} {v}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))


def join_main(argv):
    """Counts and reasons of one tilegym_suite.sh run (DIR/ids.txt, gpu_*.tsv, cpu_*.tsv);
    writes DIR/join.tsv (id, GPU outcome/seconds/reason, CPU outcome/seconds/reason)."""
    import glob
    if len(argv) != 1:
        print("usage: tilegym_compare.py join DIR", file=sys.stderr)
        return 2
    d = argv[0]
    ids = _read_ids(os.path.join(d, "ids.txt"))
    gpu = read_tsvs(sorted(glob.glob(os.path.join(d, "gpu_*.tsv"))))
    cpu = read_tsvs(sorted(glob.glob(os.path.join(d, "cpu_*.tsv"))))
    none = ("NOT-RUN", 0.0, "")
    with open(os.path.join(d, "join.tsv"), "w") as f:
        f.write("node_id\tgpu\tgpu_s\tgpu_reason\tcpu\tcpu_s\tcpu_reason\n")
        for nid in ids:
            g, c = gpu.get(nid, none), cpu.get(nid, none)
            f.write(f"{nid}\t{g[0]}\t{g[1]:.2f}\t{g[2]}\t{c[0]}\t{c[1]:.2f}\t{c[2]}\n")
    print(f"{len(ids)} cutile ids in the run order (ids.txt)")
    print(f"GPU: {_count(gpu.get(n, none)[0] for n in ids)}")
    print(f"CPU: {_count(cpu.get(n, none)[0] for n in ids)}")
    for label, keep in (("all", lambda n: True),
                        ("correctness (not test_perf)", lambda n: "::test_perf" not in n),
                        ("test_perf", lambda n: "::test_perf" in n)):
        gp = [n for n in ids if keep(n) and gpu.get(n, none)[0] == "PASSED"]
        if not gp:
            continue
        co = [cpu.get(n, none)[0] for n in gp]
        both = co.count("PASSED")
        ran = [o for o in co if o not in ("NOT-RUN", "KILLED")]
        print(f"[{label}] pass on the GPU: {len(gp)}; CPU of these: {_count(co)}")
        print(f"[{label}] pass on both: {both}/{len(gp)} = {100.0 * both / len(gp):.1f}% of the GPU"
              f" passes; {both}/{len(ran)} = {100.0 * both / max(1, len(ran)):.1f}% of those the"
              " CPU finished")
    print("GPU passes that did not pass on the CPU (CPU outcome, seconds, reason):")
    for n in ids:
        c = cpu.get(n, none)
        if gpu.get(n, none)[0] == "PASSED" and c[0] not in ("PASSED", "NOT-RUN"):
            print(f"  {c[0]} {c[1]:.0f}s {n}  ({c[2]})")
    print("GPU failures/errors (GPU reason; CPU outcome):")
    for n in ids:
        g = gpu.get(n, none)
        if g[0] in ("FAILED", "ERROR"):
            print(f"  {g[0]} {n}  ({g[2]}; CPU {cpu.get(n, none)[0]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
