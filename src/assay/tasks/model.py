"""The Task: one KernelBench-format file, loaded at a chosen size.

A task file defines ``class Model(nn.Module)``, ``get_inputs()`` and ``get_init_inputs()``.
Bundled tasks may also define ``ASSAY_SIZES = {"small": {"batch_size": 4, ...}, "medium": ...}``:
module globals to override for smaller variants ("small": tests and the CI campaign; "medium":
the cpu target, large enough that the kernel and not the call dominates, see
config/tasks/bundled.yaml; a task without "medium" uses its "small" there). ``get_inputs`` reads those globals when it is called,
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
SIZES = ("large", "medium", "small")
_STEM = re.compile(r"^(?P<number>\d+)_(?P<name>.+)$")
_LEVEL_DIR = re.compile(r"^level_?(?P<level>\d+)$")


class TaskError(ValueError):
    """A task file that cannot be used; the message is one line naming the file."""


def one_line(e: BaseException, limit: int = 300) -> str:
    """``Type: message`` on one line, clipped: how task errors are reported."""
    msg = " ".join(str(e).split())
    if len(msg) > limit:
        msg = msg[:limit] + "..."
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


def source_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def task_id_for(level: int, path: Path) -> str:
    """A task's id: ``L<level>_<file stem>``, e.g. ``L1_19_ReLU``; safe in paths and wildcards."""
    stem = re.sub(r"[^A-Za-z0-9_]+", "_", path.stem).strip("_")
    return f"L{level}_{stem}"


def level_of(path: Path, default: int = 1) -> int:
    m = _LEVEL_DIR.match(path.parent.name)
    return int(m.group("level")) if m else default


def read_source(path: Path) -> str:
    """A task file's text; a TaskError naming the file if it is not readable UTF-8 Python."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise TaskError(f"{path}: is a folder, not a task file") from None
    except OSError as e:
        raise TaskError(f"{path}: cannot read task file: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                        f"{e.start}); task files are Python source in UTF-8") from None
    if "\0" in text:
        raise TaskError(f"{path}: contains a NUL byte at offset {text.index(chr(0))}; not a "
                        f"Python source file") from None
    return text


def check_source(path: Path, text: str) -> None:
    """Cheap static check (no torch, no execution): parses and defines the required names."""
    if not text.strip():
        raise TaskError(f"{path}: empty file (KernelBench format needs class Model, "
                        f"get_inputs() and get_init_inputs())")
    try:
        tree = ast.parse(text, filename=str(path))
    except SyntaxError as e:
        raise TaskError(f"{path}: syntax error at line {e.lineno}: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:  # NUL bytes, absurd nesting
        raise TaskError(f"{path}: cannot parse: {type(e).__name__}: {e}") from None
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            defined |= {(a.asname or a.name).split(".")[0] for a in node.names}
    missing = [n for n in REQUIRED_NAMES if n not in defined]
    if missing:
        raise TaskError(f"{path}: missing {', '.join(missing)} (KernelBench format needs "
                        f"class Model, get_inputs() and get_init_inputs())")


def resolve_size(size: str, target: str) -> str:
    """``auto``: the task's own (large) size on cuda, its medium variant on cpu (a task without
    one loads at its small variant, and one without any at its own size)."""
    if size == "auto":
        return "large" if target == "cuda" else "medium"
    return size


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
        text = read_source(path)
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
        except KeyboardInterrupt:
            raise
        except SystemExit as e:
            raise TaskError(f"{self.path}: executing the file calls sys.exit({e.code!r}); a task "
                            f"file must only define Model, get_inputs and get_init_inputs") \
                from None
        except BaseException as e:  # noqa: BLE001 - any failure of user code is a task error
            raise TaskError(f"{self.path}: executing the file failed: {one_line(e)}") from None
        for name in REQUIRED_NAMES:
            if not hasattr(mod, name):
                raise TaskError(f"{self.path}: {name} is not defined after executing the file")
        if not isinstance(mod.Model, type):
            raise TaskError(f"{self.path}: Model is a {type(mod.Model).__name__}, not a class")
        for name in ("get_inputs", "get_init_inputs"):
            if not callable(getattr(mod, name)):
                raise TaskError(f"{self.path}: {name} is a {type(getattr(mod, name)).__name__}, "
                                f"not a function")
        sizes = getattr(mod, "ASSAY_SIZES", None) or {}
        if not isinstance(sizes, dict) or not all(isinstance(v, dict) for v in sizes.values()):
            raise TaskError(f"{self.path}: ASSAY_SIZES must be a dict of dicts, like "
                            f"{{'small': {{'batch_size': 4}}}}")
        overrides = sizes.get(self.size, sizes.get("small", {}) if self.size == "medium" else {})
        for key, value in overrides.items():
            if key not in mod.__dict__:
                raise TaskError(f"{self.path}: ASSAY_SIZES[{self.size!r}] overrides {key!r}, "
                                f"which the file does not define")
            mod.__dict__[key] = value
        return mod

    @property
    def has_small_variant(self) -> bool:
        return "small" in (getattr(self.module(), "ASSAY_SIZES", None) or {})
