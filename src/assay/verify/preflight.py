"""Cheap checks of a candidate file before anything is prepared, built or timed.

The file is read and parsed, never executed (candidate code runs only in the sandbox): it must
be UTF-8 Python that parses, define ``ModelNew`` at the top level (a class, an assignment or an
import), and every module it imports unconditionally at the top level must be installed. A
failure is one line naming the user's file, so `assay verify` answers in a second where it
used to answer after the baselines were timed.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path


def _top_level(body: list[ast.stmt], in_try: bool = False):
    """Top-level statements, into if/with/try blocks (not functions or classes); yields
    (statement, inside a try block)."""
    for node in body:
        yield node, in_try
        if isinstance(node, (ast.If, ast.With)):
            yield from _top_level(node.body, in_try)
            yield from _top_level(getattr(node, "orelse", []), in_try)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody,
                         *[h.body for h in node.handlers]):
                yield from _top_level(part, True)


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name):
        return {node.target.id}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    return set()


def _missing_module(node: ast.stmt) -> str:
    """The first top-level module an import statement needs that is not installed."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
        names = [node.module]
    else:
        return ""
    for name in names:
        top = name.split(".")[0]
        try:
            if importlib.util.find_spec(top) is None:  # finds, never imports, a top-level name
                return top
        except (ImportError, ValueError):
            return top
    return ""


def preflight(path: Path) -> str:
    """'' if the candidate passes the cheap checks, else one line saying why (file and line)."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        return f"{path}: cannot read candidate: {e.strerror or e}"
    except UnicodeDecodeError as e:
        return f"{path}: not UTF-8 text (offset {e.start}); a candidate is Python source"
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as e:
        return f"{path}: syntax error at line {e.lineno}: {e.msg}"
    except (ValueError, RecursionError, MemoryError) as e:
        return f"{path}: cannot parse: {type(e).__name__}: {e}"
    defined: set[str] = set()
    for node, in_try in _top_level(tree.body):
        defined |= _defines(node)
        missing = "" if in_try else _missing_module(node)
        if missing:
            return (f"{path}: line {node.lineno} imports {missing!r}, which is not installed "
                    f"(ModuleNotFoundError)")
    # A name built some other way (globals(), exec) still reaches the worker, which decides.
    if "ModelNew" not in defined and "ModelNew" not in text:
        return f"{path}: does not define class ModelNew at the top level"
    return ""
