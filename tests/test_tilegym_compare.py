"""tools/tilegym_compare.py: GPU junit outcomes joined with the CPU table (issue 37). TileGym's
node ids contain spaces and brackets; the interrupted test's empty <testcase/> is not a result."""
import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
spec = importlib.util.spec_from_file_location("tilegym_compare",
                                              os.path.join(ROOT, "tools", "tilegym_compare.py"))
tc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tc)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.ops.test_a.Test_A" name="test_op[cutile-(16, 4)-GQA group_size=4]" time="1.5"/>
<testcase classname="tests.ops.exp.test_b.Test_B" name="test_op[cutile-1]" time="0.1">
<skipped message="no"/></testcase>
<testcase classname="tests.ops.test_c.Test_C" name="test_op[cutile-2]" time="2"><failure message="x"/></testcase>
<testcase classname="tests.ops.test_d.Test_D" name="test_op[cutile-3]" time="2"/>
<testcase time="0.001"/></testsuite></testsuites>"""

CPU = """| test | outcome | reason |
|---|---|---|
| `test_a.py::Test_A::test_op[cutile-(16, 4)-GQA group_size=4]` | PASSED |  |
| `exp/test_b.py::Test_B::test_op[cutile-1]` | SKIPPED | own skip |
| `test_d.py::Test_D::test_op[cutile-3]` | TIMEOUT | too large |
"""


def test_compare(tmp_path, capsys):
    (tmp_path / "j.xml").write_text(JUNIT)
    (tmp_path / "cpu.md").write_text(CPU)
    rows = tc.junit_outcomes([str(tmp_path / "j.xml")])
    assert [(r[0].split("::")[0], r[1]) for r in rows] == [
        ("tests/ops/test_a.py", "PASSED"), ("tests/ops/exp/test_b.py", "SKIPPED"),
        ("tests/ops/test_c.py", "FAILED"), ("tests/ops/test_d.py", "PASSED")]
    assert rows[0][0] == "tests/ops/test_a.py::Test_A::test_op[cutile-(16, 4)-GQA group_size=4]"
    assert tc.main([str(tmp_path / "out"), str(tmp_path / "j.xml"), "--cpu", str(tmp_path / "cpu.md")]) == 0
    out = capsys.readouterr().out
    assert "pass on the GPU: 2; of these pass on the CPU: 1 (50.0%)" in out
    assert "differs: GPU PASSED, CPU TIMEOUT" in out and "(too large)" in out
    lines = (tmp_path / "out" / "outcomes.tsv").read_text().splitlines()
    assert lines[1].split("\t") == ["PASSED", "1.500", rows[0][0]]
    cmp_rows = [r.split("\t") for r in (tmp_path / "out" / "compare.tsv").read_text().splitlines()]
    assert cmp_rows[3][1:3] == ["FAILED", "NOT-RUN"]
