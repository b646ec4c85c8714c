"""The bundled task suite (data/tasks/level*/): every task loads, runs small on CPU, and is large at its large size."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from assay.tasks.instantiate import make_inputs, reference_model
from assay.tasks.model import Task

TASKS_DIR = Path(__file__).resolve().parents[1] / "data" / "tasks"
TASK_FILES = sorted(TASKS_DIR.glob("level*/*.py"))
FILE_NAME = re.compile(r"^(?P<number>\d+)_[A-Za-z0-9_]+\.py$")
MIN_PER_LEVEL = {1: 12, 2: 8, 3: 5}
LARGE_MIN_ELEMENTS = 1_000_000
LARGE_MAX_BYTES = 4 * 2**30


def _ids(paths):
    return [f"{p.parent.name}/{p.stem}" for p in paths]


def _is_degenerate(path: Path) -> bool:
    return "degenerate" in path.stem.lower()


@pytest.fixture(autouse=True)
def _few_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_suite_has_enough_tasks_per_level():
    counts = {lvl: 0 for lvl in MIN_PER_LEVEL}
    for path in TASK_FILES:
        level = Task.from_file(path).level
        counts[level] = counts.get(level, 0) + 1
    for lvl, minimum in MIN_PER_LEVEL.items():
        assert counts[lvl] >= minimum, f"level{lvl} has {counts[lvl]} tasks, expected >= {minimum}"
    assert sum(1 for p in TASK_FILES if _is_degenerate(p)) == 1


@pytest.mark.parametrize("level_dir", sorted(p for p in TASKS_DIR.glob("level*") if p.is_dir()),
                         ids=lambda p: p.name)
def test_file_names_are_numbered_consecutively(level_dir):
    names = [p.name for p in level_dir.glob("*.py")]
    for name in names:
        assert FILE_NAME.match(name), f"{level_dir.name}/{name}: expected <N>_<Name>.py"
    numbers = sorted(int(FILE_NAME.match(n).group("number")) for n in names)
    assert numbers == list(range(1, len(numbers) + 1)), f"{level_dir.name}: numbers {numbers}"


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_task_declares_small_size_and_docstring(path):
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), f"{path.name}: needs a module docstring"
    task = Task.from_file(path, size="small")
    assert task.has_small_variant
    mod = task.module()
    sizes = mod.ASSAY_SIZES
    assert isinstance(sizes, dict) and "small" in sizes
    assert sizes["small"], f"{path.name}: ASSAY_SIZES['small'] overrides nothing"
    large = Task.from_file(path, size="large").module()
    for key, value in sizes["small"].items():
        assert key in large.__dict__, f"{path.name}: {key!r} is not a module global"
        assert mod.__dict__[key] == value


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_small_size_runs_on_cpu(path):
    task = Task.from_file(path, size="small")
    mod = task.module()
    model = reference_model(mod, seed=0, device="cpu")
    inputs = make_inputs(mod, seed=1, device="cpu")
    assert inputs and all(isinstance(x, torch.Tensor) for x in inputs)
    for x in inputs:
        if x.is_floating_point():
            assert x.dtype == torch.float32
    with torch.no_grad():
        out = model(*inputs)
        assert isinstance(out, torch.Tensor), f"{path.name}: forward must return one tensor"
        assert out.numel() > 0
        assert torch.isfinite(out).all(), f"{path.name}: non-finite output"
        # Inputs sampled under another seed: the output must move, except for the task that is
        # degenerate on purpose, whose output must not.
        other = model(*make_inputs(mod, seed=2, device="cpu"))
        assert torch.isfinite(other).all()
    if _is_degenerate(path):
        torch.testing.assert_close(out, other)
        assert torch.allclose(out, torch.full_like(out, float(out.flatten()[0])), atol=1e-5)
    else:
        assert not torch.allclose(out, other), f"{path.name}: output does not depend on input"


def _numel(tensors) -> int:
    return sum(t.numel() for t in tensors)


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_large_size_is_large(path):
    small = Task.from_file(path, size="small").module()
    large = Task.from_file(path, size="large").module()
    with torch.device("meta"):
        model = large.Model(*large.get_init_inputs())
        inputs = large.get_inputs()
        small_inputs = small.get_inputs()
    params = list(model.parameters()) + list(model.buffers())
    assert all(t.is_meta for t in params + inputs)
    # Overriding the globals changed the sizes, so get_inputs reads them at call time.
    assert _numel(small_inputs) < _numel(inputs)
    total = _numel(inputs) + (_numel(params) if params else 0)
    assert total >= LARGE_MIN_ELEMENTS, f"{path.name}: large size has only {total} elements"
    if not params:
        assert _numel(inputs) >= LARGE_MIN_ELEMENTS
    with torch.no_grad():
        out = model.eval()(*inputs)
    assert isinstance(out, torch.Tensor)
    footprint = _nbytes(inputs) + _nbytes(params) + _nbytes([out])
    assert footprint < LARGE_MAX_BYTES, f"{path.name}: {footprint / 2**30:.2f} GiB"
