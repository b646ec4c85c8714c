"""benchmarks/other_sizes.py: KernelBench-format task files at other sizes (the module's
non-structural int sizes moved off their values, the batch alone where the reference breaks
otherwise, the file unchanged where it breaks even so), and the comparison of two plans.json."""

from __future__ import annotations

import importlib.util
import json

import pytest

from helpers import REPO

_spec = importlib.util.spec_from_file_location("other_sizes", REPO / "benchmarks/other_sizes.py")
other_sizes = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(other_sizes)

_TASK = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features, kernel_size):
        super().__init__()
        self.norm = nn.LayerNorm(NORM)
        self.kernel_size = kernel_size

    def forward(self, x):
        return self.norm(x) * self.kernel_size


batch_size = 16
features = 4096
kernel_size = 3
groups = 8
odd = 7
tiny = 3
N = 2 * 1024


def get_inputs():
    return [torch.randn(batch_size, features)]


def get_init_inputs():
    return [features, kernel_size]
"""


def test_sizes_move_off_their_values_and_structural_ones_stay():
    text, changed = other_sizes.resized(_TASK.replace("NORM", "features"))
    assert changed == {"batch_size": (16, 15), "features": (4096, 4095), "odd": (7, 9)}
    assert "kernel_size = 3" in text and "groups = 8" in text and "tiny = 3" in text
    assert "N = 2 * 1024" in text  # an expression: left as written
    assert other_sizes.runs(text, "moved.py")


def test_a_reference_broken_by_the_sizes_gets_the_batch_alone_or_no_change(tmp_path):
    src = tmp_path / "kb"
    (src / "level1").mkdir(parents=True)
    # the norm's size written apart from the features': moving them breaks the reference
    (src / "level1" / "1_norm_literal.py").write_text(_TASK.replace("NORM", "4096"))
    (src / "level1" / "2_norm_features.py").write_text(_TASK.replace("NORM", "features"))
    (src / "level1" / "3_no_batch.py").write_text(
        _TASK.replace("NORM", "4096").replace("batch_size", "rows"))
    kinds = other_sizes.write_copies(src, tmp_path / "out")
    assert kinds == {"all": ["level1/2_norm_features.py"],
                     "batch": ["level1/1_norm_literal.py"],
                     "none": ["level1/3_no_batch.py"], "unjudged": []}
    out = tmp_path / "out" / "level1"
    assert "batch_size = 15" in (out / "1_norm_literal.py").read_text()
    assert "features = 4096" in (out / "1_norm_literal.py").read_text()
    assert (out / "3_no_batch.py").read_text() == (src / "level1" / "3_no_batch.py").read_text()


def _plans_json(planned: list[str], declined: dict[str, str]) -> str:
    rows = [{"task": t, "level": 1, "kernels": 1, "forms": ["row (strict)"], "declined": None}
            for t in planned]
    rows += [{"task": t, "level": 1, "kernels": 0, "forms": [], "declined": why}
             for t, why in declined.items()]
    return json.dumps({"source": "kb", "target": "cuda", "size": "large", "tasks": rows})


def test_compare_lists_what_only_the_first_sizes_plan(tmp_path, capsys):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(_plans_json(["L1_1_A", "L1_2_B"], {"L1_3_C": "no"}))
    second.write_text(_plans_json(["L1_1_A"], {"L1_2_B": "a size coincidence", "L1_3_C": "no"}))
    assert other_sizes.compare(first, second) == 1
    out = capsys.readouterr().out
    assert "planned at the first sizes only: 1" in out and "L1_2_B: a size coincidence" in out
    assert other_sizes.compare(first, first) == 0


def test_compare_names_a_file_that_is_not_a_plans_json(tmp_path):
    bad = tmp_path / "plans.md"
    bad.write_text("# plans\n")
    with pytest.raises(SystemExit, match=r"plans.md: not a plans.json"):
        other_sizes.compare(bad, bad)
