"""The architecture's rules, checked on the source (ARCHITECTURE.md states them):

- data flows one way: gpu/kernels import only cuda.tile, math and each other; gpu/ never
  imports spak's framework or the simulator, nor torch at module level; sim/ never imports
  gpu/ or torch at module level; nothing but spak/cli imports spak.cli;
- no import circle among the framework's modules, spak/ (imports inside functions count:
  they are edges too, only deferred); the simulator's own modules (sim/) break their load
  order with deferred imports and are not held to this;
- no function over 80 lines without a reason in the comment right above it
  (`# long: <why>`).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: installed name -> folder
PACKAGES = {"spak": ROOT / "spak", "spak.sim": ROOT / "sim", "spak.gpu": ROOT / "gpu"}
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for name, folder in PACKAGES.items():
        for p in folder.rglob("*.py"):
            rel = p.relative_to(folder).with_suffix("").parts
            if rel[-1] == "__init__":
                rel = rel[:-1]
            out[".".join((name, *rel))] = p
    return out


def _imports(path: Path, modname: str, *, top_level_only: bool = False) -> set[str]:
    """Absolute names of the modules `path` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = modname if path.name == "__init__.py" else modname.rsplit(".", 1)[0]
    nodes = tree.body if top_level_only else ast.walk(tree)
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                parts = parts[:len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {m: {i for i in _imports(p, m) if i in mods and i != m} for m, p in mods.items()}


def test_no_import_circle_in_spak():
    framework = {m for m, p in _modules().items() if PACKAGES["spak"] in p.parents}
    graph = {m: deps & framework for m, deps in _graph().items() if m in framework}
    # a package importing its own submodules (spak.families -> spak.families.base) is how
    # packages work, not a circle through logic: drop parent -> child edges
    graph = {m: {i for i in deps if not i.startswith(m + ".")} for m, deps in graph.items()}
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == [], "import circles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_layering():
    bad = []
    for m, p in _modules().items():
        top = _imports(p, m, top_level_only=True)
        every = _imports(p, m)
        if m.startswith("spak.gpu.kernels"):
            bad += [(m, i) for i in top if not (i in ("math", "__future__") or
                                              i.startswith(("cuda.tile", "spak.gpu.kernels")))]
        if m.startswith("spak.gpu"):
            bad += [(m, i) for i in every if i.startswith("spak.sim")
                    or (i.startswith("spak.") and not i.startswith("spak.gpu"))]
            bad += [(m, i) for i in top if i.split(".")[0] == "torch"]
        if m.startswith("spak.sim"):
            bad += [(m, i) for i in every if i.startswith("spak.gpu")]
            bad += [(m, i) for i in top if i.split(".")[0] == "torch"]
        if not m.startswith("spak.cli") and m != "spak.__main__":
            bad += [(m, i) for i in every if i.startswith("spak.cli")]
    assert bad == [], "imports against the layering rules: " + repr(sorted(bad))


def test_long_functions_say_why():
    long_ = []
    for m, p in _modules().items():
        lines = p.read_text().splitlines()
        for node in ast.walk(ast.parse("\n".join(lines))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                comment, i = [], first - 2          # the comment block right above
                while i >= 0 and lines[i].strip().startswith("#"):
                    comment.append(lines[i].strip())
                    i -= 1
                if n > MAX_FUNCTION_LINES and not any(c.startswith("# long:") for c in comment):
                    long_.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({n} lines)")
    assert long_ == [], "functions over 80 lines without a `# long: <why>` line above:\n" + \
        "\n".join(long_)
