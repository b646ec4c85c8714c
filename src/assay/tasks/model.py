"""The Task: one KernelBench-format file, loaded at a chosen size.

A task file defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``.
Bundled tasks may also define ``ASSAY_SIZES = {"small": {"batch_size": 4, ...}}``: module
globals to override for a smaller variant. ``get_inputs`` reads those globals when it is called,
so overriding them after the file is executed changes the sizes without touching the file, and a
KernelBench checkout (which has no ``ASSAY_SIZES``) loads unchanged at its one size.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import types
from dataclasses import dataclass
from pathlib import Path

REQUIRED_NAMES = ("Model", "get_inputs", "get_init_inputs")
SIZES = ("large", "small")
_STEM = re.compile(r"^(?P<number>\d+)_(?P<name>.+)$")
_LEVEL_DIR = re.compile(r"^level_?(?P<level>\d+)$")


class TaskError(ValueError):
    """A task file that cannot be used; the message is one line naming the file."""


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def task_id_for(level: int, path: Path) -> str:
    """A task's id: ``L<level>_<file stem>``, e.g. ``L1_19_ReLU``; safe in paths and wildcards."""
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", path.stem).strip("_")
    return f"L{level}_{stem}"


def level_of(path: Path, default: int = 1) -> int:
    m = _LEVEL_DIR.match(path.parent.name)
    return int(m.group("level")) if m else default


def check_source(path: Path, text: str) -> None:
    """Cheap static check (no torch, no execution): parses and defines the required names."""
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as e:
        raise TaskError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from None
    defined = {
        node.name
        for node in tree.body
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
    }
    defined |= {
        t.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise TaskError(f"{path}: missing {', '.join(missing)} (KernelBench format needs "
                        f"class Model, get_inputs() and get_init_inputs())")


@dataclass(frozen=True)
class Task:
    id: str
    level: int
    number: int
    name: str
    path: Path
    source: str
    source_hash: str
    size: str = "large"

    @classmethod
    def from_file(cls, path: str | Path, size: str = "large", level: int | None = None) -> "Task":
        path = Path(path)
        if size not in SIZES:
            raise TaskError(f"{path}: unknown size {size!r} (choose from {', '.join(SIZES)})")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise TaskError(f"{path}: cannot read task file: {e}") from None
        check_source(path, text)
        lvl = level if level is not None else level_of(path)
        m = _STEM.match(path.stem)
        number = int(m.group("number")) if m else 0
        name = m.group("name") if m else path.stem
        return cls(task_id_for(lvl, path), lvl, number, name, path, text, source_hash(text), size)

    def module(self) -> types.ModuleType:
        """Execute the file in a fresh module and apply this size's global overrides."""
        mod = types.ModuleType(f"assay_task_{self.id}")
        mod.__file__ = str(self.path)
        # Registered so dataclasses, pickling and typing in the task can find their module.
        sys.modules[mod.__name__] = mod
        try:
            exec(compile(self.source, str(self.path), "exec"), mod.__dict__)
        except Exception as e:  # noqa: BLE001 - any failure of user code is a task error
            raise TaskError(f"{self.path}: executing the task failed: "
                            f"{type(e).__name__}: {e}") from None
        for name in REQUIRED_NAMES:
            if not hasattr(mod, name):
                raise TaskError(f"{self.path}: {name} is not defined after executing the file")
        overrides = (getattr(mod, "ASSAY_SIZES", None) or {}).get(self.size, {})
        for key, value in overrides.items():
            if key not in mod.__dict__:
                raise TaskError(f"{self.path}: ASSAY_SIZES[{self.size!r}] overrides {key!r}, "
                                f"which the file does not define")
            mod.__dict__[key] = value
        return mod

    @property
    def has_small_variant(self) -> bool:
        return "small" in (getattr(self.module(), "ASSAY_SIZES", None) or {})
