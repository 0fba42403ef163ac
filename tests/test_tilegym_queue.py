"""tools/pytest_queue.py and tools/tilegym_compare.py order/join (issue 37's whole-suite job):
pytest processes sharing one ordered id list run each id exactly once, in the list's order,
write a row per finished test, stop claiming at the deadline; the join counts what it read."""
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")

SUITE = '''
import pytest

@pytest.mark.parametrize("i", range(6))
def test_a(i):
    assert i != 4, "four fails"

def test_skip():
    pytest.skip("not here")

@pytest.mark.parametrize("n", ["x y", "z"])
def test_spaces(n):
    pass
'''


def _run(tmp, ids, claims, out, deadline, extra=()):
    env = dict(os.environ, PYTHONPATH=TOOLS + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTEST_QUEUE_IDS=str(ids), PYTEST_QUEUE_CLAIMS=str(claims),
               PYTEST_QUEUE_OUT=str(out), PYTEST_QUEUE_DEADLINE=str(deadline))
    return subprocess.Popen([sys.executable, "-m", "pytest", "-p", "pytest_queue", "-p",
                             "no:cacheprovider", "-q", "test_suite.py", *extra],
                            cwd=tmp, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _rows(paths):
    rows = []
    for p in paths:
        if os.path.exists(p):
            with open(p) as f:
                rows += [line.rstrip("\n").split("\t") for line in f]
    return rows


def test_two_processes_share_the_queue(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    order = ["test_suite.py::test_spaces[x y]", "test_suite.py::test_a[4]",
             "test_suite.py::test_skip", "test_suite.py::test_a[0]", "test_suite.py::test_a[5]"]
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(order) + "\n")          # test_a[1..3], test_spaces[z]: not listed
    procs = [_run(tmp_path, ids, tmp_path / "claims", tmp_path / f"s{k}.tsv", time.time() + 120)
             for k in range(2)]
    for p in procs:
        p.communicate(timeout=120)
    rows = _rows([tmp_path / "s0.tsv", tmp_path / "s1.tsv"])
    done = [r for r in rows if r[0] != "STARTED"]
    assert sorted(r[2] for r in done) == sorted(order)          # each listed id exactly once
    got = {r[2]: (r[0], r[3]) for r in done}
    assert got["test_suite.py::test_a[4]"][0] == "FAILED"
    assert "four fails" in got["test_suite.py::test_a[4]"][1]
    assert got["test_suite.py::test_skip"] == ("SKIPPED", "Skipped: not here")
    assert got["test_suite.py::test_spaces[x y]"][0] == "PASSED"
    assert sorted(os.listdir(tmp_path / "claims")) == [str(i) for i in range(5)]

    # the join of these rows as one side of a run, the other side empty
    os.rename(tmp_path / "s0.tsv", tmp_path / "gpu_0.tsv")
    os.rename(tmp_path / "s1.tsv", tmp_path / "gpu_1.tsv")
    with open(tmp_path / "cpu_0.tsv", "w") as f:
        f.write("STARTED\t0\ttest_suite.py::test_a[0]\t\n")       # killed while running
        f.write("FAILED\t121\ttest_suite.py::test_a[5]\tspak sim: test ran past "
                "SPAK_SIM_TEST_TIMEOUT=120 s\n")
        f.write("PASSED\t2\ttest_suite.py::test_spaces[x y]\t\n")
    out = subprocess.run([sys.executable, os.path.join(TOOLS, "tilegym_compare.py"), "join",
                          str(tmp_path)], capture_output=True, text=True, check=True).stdout
    assert "GPU: PASSED 3 FAILED 1 SKIPPED 1" in out
    assert "pass on both: 1/3 = 33.3% of the GPU passes; 1/2 = 50.0% of those the CPU finished" in out
    assert "TIMEOUT 121s test_suite.py::test_a[5]" in out
    assert "KILLED 0s test_suite.py::test_a[0]" in out


def test_no_claim_after_the_deadline(tmp_path):
    (tmp_path / "test_suite.py").write_text(SUITE)
    ids = tmp_path / "ids.txt"
    ids.write_text("test_suite.py::test_a[0]\n")
    p = _run(tmp_path, ids, tmp_path / "claims", tmp_path / "s.tsv", time.time() - 1)
    p.communicate(timeout=120)
    assert _rows([tmp_path / "s.tsv"]) == []
    assert not os.listdir(tmp_path / "claims")


def test_order_puts_gpu_passes_first_and_perf_last(tmp_path):
    sys.path.insert(0, TOOLS)
    try:
        import tilegym_compare as tc
    finally:
        sys.path.remove(TOOLS)
    gpu = tmp_path / "gpu.tsv"
    gpu.write_text("gpu_outcome\tseconds\tnode_id\nPASSED\t1\ttests/ops/t.py::T::test_op[c]\n")
    cpu = tmp_path / "cpu.md"
    cpu.write_text("| `t.py::T::test_op[b]` | PASSED |  |\n")
    ids = ["tests/ops/t.py::T::test_perf[a]", "tests/ops/t.py::T::test_op[a]",
           "tests/ops/t.py::T::test_op[b]", "tests/ops/t.py::T::test_op[c]"]
    got = tc.run_order(ids, gpu_before=str(gpu), cpu_table=str(cpu), ci_ids=str(tmp_path / "no"))
    assert got == ["tests/ops/t.py::T::test_op[c]", "tests/ops/t.py::T::test_op[b]",
                   "tests/ops/t.py::T::test_op[a]", "tests/ops/t.py::T::test_perf[a]"]
