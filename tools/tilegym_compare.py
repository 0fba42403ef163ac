"""TileGym tests/ops outcomes on the GPU (pytest junit xml) joined with the CPU interpreter-mode
outcomes of the same node ids (the per-test table of results/tilegym_interpreter.md); issue 37.

    python tools/tilegym_compare.py OUTDIR junit_1.xml [junit_2.xml ...]

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


if __name__ == "__main__":
    sys.exit(main())
