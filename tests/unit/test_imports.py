"""The library's import graph (docs/architecture.md, dependency rules): no import cycle, no function-local import of
the project's own modules, and a planning import (what the workflow imports when it builds the DAG) without torch.

The graph is read with ``ast`` from every ``import`` in ``scripts/headatlas``, function-local ones included, so a
cycle cannot hide behind an import inside a function. Local imports of torch, transformers, matplotlib and other
heavy third-party packages may stay where they keep the planning import cheap (last test)."""

import ast
import subprocess
import sys
from pathlib import Path

from conftest import REPO

SCRIPTS = REPO / "scripts"
PACKAGE = "headatlas"

# Function-local imports of project modules still allowed, as (importing module, imported module): each needs a
# reason. These edges are also left out of the cycle check.
ALLOWED_LOCAL: set[tuple[str, str]] = set()  # (module, imported module) pairs a function may import; none


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(node, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """The project modules an import statement in ``module`` loads (the longest known module of each name)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        if node.level:  # relative: from the module's package, one level up per extra dot
            base = module.split(".")[: None if is_package else -1]
            base = base[: len(base) - (node.level - 1)]
            prefix = ".".join(base + ([node.module] if node.module else []))
        else:
            prefix = node.module
        names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return sorted(set(out))


def import_graph(root: Path, package: str = PACKAGE):
    """(edges: module -> the modules it imports, anywhere in it; local: (module, line, imported module) of every
    import of a project module inside a function)."""
    files = {module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    modules = set(files)
    edges: dict[str, set[str]] = {m: set() for m in files}
    local = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), str(path))

        def visit(node, in_function: bool, module=module, is_package=path.name == "__init__.py"):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    for target in imported_modules(child, module, is_package, modules):
                        if target != module:
                            edges[module].add(target)
                        if in_function:
                            local.append((module, child.lineno, target))
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

        visit(tree, False)
    return edges, local


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(out)


def without_allowed(edges):
    return {m: {t for t in ts if (m, t) not in ALLOWED_LOCAL} for m, ts in edges.items()}


def test_no_import_cycle():
    edges, _ = import_graph(SCRIPTS)
    assert len(edges) > 50 and edges["headatlas.fused"] >= {"headatlas.core.extract", "headatlas.core.reduce"}
    assert cycles(without_allowed(edges)) == []


def test_no_function_local_import_of_a_project_module():
    _, local = import_graph(SCRIPTS)
    found = [f"{m}:{line} imports {t}" for m, line, t in local if (m, t) not in ALLOWED_LOCAL]
    assert found == [], "move these imports to the top of their modules:\n" + "\n".join(found)
    unused = ALLOWED_LOCAL - {(m, t) for m, _, t in local}
    assert not unused, f"allow-list entries with no local import left (remove them): {sorted(unused)}"


# package -> the other packages it may import (docs/architecture.md, dependency rules); the top-level modules
# (fused, cli, look) join packages and may import any
MAY_IMPORT = {
    "core": set(),
    **{paper: {"core"} for paper in ("clark", "pande", "jomyaeng", "detectors", "position", "ablation")},
    "atlas": {"core", "detectors"},  # reads the papers through their TSVs; the detectors' registry names its columns
    "report": {"core", "atlas"},  # the atlas column registry: which columns are CI pairs
    "circuits": {"core", "detectors", "ablation"},  # reuses the detectors' reducers and the ablation's patching
    "quiet": {"core", "detectors", "ablation"},  # the detectors' natural inputs; the ablation's zero-ablation
    "icl": {"core", "ablation"},  # function-vector heads: the ablation's patch, batched passes and layer check
}


def test_packages_import_only_what_the_plan_allows():
    edges, _ = import_graph(SCRIPTS)
    part = lambda m: m.split(".")[1] if "." in m else m  # headatlas.core.store -> core, headatlas.fused -> fused
    packages = {m.split(".")[1] for m in edges if m.count(".") >= 2}
    assert packages == set(MAY_IMPORT), "a new package: give it its line in MAY_IMPORT (and docs/architecture.md)"
    found = [
        f"{m} imports {t}"
        for m, targets in sorted(edges.items())
        if m.count(".") >= 2
        for t in sorted(targets)
        if part(t) not in MAY_IMPORT[part(m)] | {part(m)}
    ]
    assert found == []


def test_the_scan_finds_a_cycle_and_a_local_import(tmp_path):
    """The scan on a small package: a cycle through a function-local import, relative and absolute forms."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .sub import b\n")
    (pkg / "sub" / "b.py").write_text("import os\n\ndef f():\n    from .. import a\n    import numpy\n")
    (pkg / "c.py").write_text("from pkg.sub.b import f\nfrom . import a as alias\n")
    edges, local = import_graph(tmp_path, "pkg")
    assert edges == {"pkg": set(), "pkg.a": {"pkg.sub.b"}, "pkg.c": {"pkg.a", "pkg.sub.b"}, "pkg.sub": set(),
                     "pkg.sub.b": {"pkg.a"}}  # fmt: skip
    assert local == [("pkg.sub.b", 4, "pkg.a")]
    assert cycles(edges) == [["pkg.a", "pkg.sub.b"]]


def test_planning_import_loads_no_torch():
    """What the workflow imports when it plans (common.smk, atlas_common.smk and every analysis's fused plan)
    loads neither torch, transformers nor matplotlib: the function-local imports of those are what keeps it so."""
    code = (
        "import sys\n"
        "import headatlas.core.config_checks, headatlas.core.inputs, headatlas.core.integrity, headatlas.core.store\n"
        "import headatlas.atlas.analysis, headatlas.fused\n"
        "for key in headatlas.fused.PLANS:\n"
        "    headatlas.fused.plan_function(key)\n"
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
