"""The package layout holds its shape: no import cycle between the packages of src/assay, the
steps on top (no package imports one), and the steps that run on the GPU machine light.

A package is a first-level name under ``assay`` (``assay.verify``, ``assay.app``); an import
is any ``import``/``from ... import`` in its files, at module level or inside a function (a
lazy import is still an arrow: it decides what must be installed and what may change together).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from helpers import REPO

PKG = REPO / "src" / "assay"
Edges = dict[str, dict[str, list[str]]]  # package -> imported package -> ["file:line", ...]


def _imported_modules(root: Path, path: Path, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted modules an import statement names (``from a import b`` names a and a.b)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:  # relative: resolved against the file's package
        parts = list(path.relative_to(root.parent).parent.parts)
        base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module
                                                               else []))
    else:
        base = node.module or ""
    return [base] + [f"{base}.{a.name}" for a in node.names]


def _package(root: Path, name: str) -> str | None:
    """``assay.verify.harness`` -> ``verify``; None outside assay or for a name it lacks."""
    parts = name.split(".")
    if parts[0] != "assay" or len(parts) < 2:
        return None
    first = parts[1]
    return first if (root / first).is_dir() or (root / f"{first}.py").is_file() else None


def package_imports(root: Path = PKG) -> Edges:
    """Every package-to-package import under ``root``, with the places that make it."""
    edges: Edges = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("*.py")):
        src = path.relative_to(root).parts[0].removesuffix(".py")
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported_modules(root, path, node):
                dst = _package(root, name)
                if dst and dst != src:
                    where = f"{path.relative_to(root.parent)}:{node.lineno}"
                    if where not in edges[src][dst]:
                        edges[src][dst].append(where)
    return edges


def find_cycle(edges: Edges) -> list[str] | None:
    """One cycle of the package graph as [a, b, ..., a], or None (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, {})):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_between_packages():
    edges = package_imports()
    cycle = find_cycle(edges)
    if cycle:
        hops = [f"{a} -> {b} ({', '.join(edges[a][b][:3])})" for a, b in zip(cycle, cycle[1:])]
        raise AssertionError("packages of src/assay import each other in a circle; cut one "
                             "arrow (move the function to the lower package, or the caller "
                             "up into assay/steps):\n  " + "\n  ".join(hops))


def test_the_cycle_finder_finds_cycles():
    """The guard above can fail: a made-up tree with a circle through a lazy import."""
    assert find_cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {}}) is None
    assert find_cycle({"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}}) == \
        ["a", "b", "c", "a"]


def test_the_graph_sees_lazy_and_relative_imports(tmp_path):
    root = tmp_path / "assay"
    (root / "low").mkdir(parents=True)
    (root / "high").mkdir()
    (root / "low" / "__init__.py").write_text("def f():\n    from assay.high import g\n")
    (root / "high" / "__init__.py").write_text("from ..low import f\n")
    edges = package_imports(root)
    assert set(edges["low"]) == {"high"} and set(edges["high"]) == {"low"}
    assert find_cycle(edges) == ["high", "low", "high"]


def test_no_package_imports_a_step():
    """The steps (one module per Snakemake rule) are the top: packages never import them."""
    edges = package_imports()
    users = {src: places["steps"] for src, places in edges.items() if "steps" in places}
    assert not users, f"a package imports assay.steps: {users}"
    rules = {p.stem for p in (PKG / "steps").glob("*.py")} - {"__init__", "__main__"}
    smk = "\n".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    declared = set(re.findall(r"^rule (\w+):", smk, flags=re.M))
    assert rules == declared, "assay/steps/ holds one module per rule of workflow/rules"
    from assay.steps import RULES  # what `python -m assay.steps RULE` accepts

    assert set(RULES) == declared


def test_gpu_steps_import_no_heavy_pipeline_library():
    """extract, device, baseline, verify and profile run on the GPU machine with torch and
    small wheels: polars, litellm, mlflow and snakemake stay out of their imports."""
    code = ("import sys\n"
            "import assay.steps.extract, assay.steps.device, assay.steps.baseline, "
            "assay.steps.verify, assay.steps.profile\n"
            "heavy = [m for m in ('polars', 'litellm', 'mlflow', 'snakemake')\n"
            "         if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300, cwd=REPO)


def _step_gpu(path: Path) -> object:
    """The ``gpu=`` a step module passes to ``app.step`` (False when none)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "step":
            for kw in node.keywords:
                if kw.arg == "gpu":
                    return ast.literal_eval(kw.value)
    return False


def test_gpu_rules_run_steps_that_take_the_device_before_using_it():
    """The rules holding Snakemake's ``gpu`` resource run steps that take a GPU lease; a step
    that takes the device late (``gpu="late"``: its start-up runs beside another job's device
    work) says where, with ``app.on_device`` before its first use of the device or by handing
    ``assay.gpu.device_lock()`` to the child process that uses it."""
    smk = "\n".join(p.read_text() for p in (REPO / "workflow" / "rules").glob("*.smk"))
    rules = re.finditer(r"^rule (\w+):(.*?)(?=^rule |\Z)", smk, flags=re.M | re.S)
    gpu_rules = {m.group(1) for m in rules if re.search(r"^\s+gpu=GPU", m.group(2), flags=re.M)}
    assert gpu_rules == {"extract", "device", "baseline", "verify", "profile"}, gpu_rules
    for rule in sorted(gpu_rules):
        path = PKG / "steps" / f"{rule}.py"
        gpu = _step_gpu(path)
        assert gpu in (True, "late"), f"{path.name}: app.step(gpu=...) is {gpu!r}"
        if gpu == "late":  # on_device, or the lock handed to the child that uses the device
            text = path.read_text()
            assert "app.on_device(cfg)" in text or "device_lock=lease.device_lock()" in text, \
                f"{path.name} takes the device late but never says where"
