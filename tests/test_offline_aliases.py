"""In-place writes in a task's forward (rewrites.follow_writes, rewrites.augmented_alias): a read of a
tensor after an in-place write to it reads the written value, as in eager, or the task is
declined where the plan cannot say so (a write seen through a view, an augmented assignment
that fx records as a new value)."""

from __future__ import annotations

import random
import textwrap

import pytest

from assay.propose.offline import OfflineSynthesizer
from helpers import assert_matches_reference, task_ctx

pytestmark = pytest.mark.usefixtures("offline_builds")

INIT = "self.act = nn.ReLU(inplace=True)"

# name: forward body (x: [b, d]); a planned task's candidate must equal eager
PLANNED = {
    # z names y; y.add_ writes it: z * 2 is (3x + 1) * 2
    "method_alias": "y = x * 3\nz = y\ny.add_(1)\nreturn z * 2",
    # the ReLU module writes w; the later read of w sees relu(x - 1)
    "module_inplace": "w = x - 1\nself.act(w)\nreturn w * 0.5 + x",
    # the functional form, on a value read again after it
    "functional_inplace": "w = x * 2 - 1\nF.relu(w, inplace=True)\nreturn w + w.sum(-1, "
                          "keepdim=True)",
    # a residual: out += identity writes out, which nothing else names (ResNet's blocks)
    "residual": "identity = x\nout = x * 2\nout += identity\nreturn torch.relu(out)",
}
DECLINED = {
    # fx records y += 1 as y = y + 1: z would keep the old value
    "augmented_alias": ("y = x * 3\nz = y\ny += 1\nreturn z * 2", "augmented assignment to 'y'"),
    # a view of y written in place, y read after it
    "view_write": ("y = x * 3\nv = y[:, :2]\nv.mul_(2)\nreturn y + 1", "in-place write to a "
                   "tensor whose view"),
}


def _source(body: str) -> str:
    return ("import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"
            "b, d = 4, 6\n\n\nclass Model(nn.Module):\n    def __init__(self):\n"
            f"        super().__init__()\n        {INIT}\n\n    def forward(self, x):\n"
            + textwrap.indent(body, " " * 8) + "\n\n\n"
            "def get_inputs():\n    return [torch.randn(b, d)]\n\n\n"
            "def get_init_inputs():\n    return []\n")


@pytest.mark.parametrize("name", list(PLANNED))
def test_reads_after_an_in_place_write_see_it(tmp_path, name):
    (tmp_path / f"{name}.py").write_text(_source(PLANNED[name]))
    ctx = task_ctx(tmp_path, name)
    prop = OfflineSynthesizer("cpu").translate(ctx, n=1, rng=random.Random(0))[0]
    assert prop.code is not None, prop.declined
    assert_matches_reference(prop.code, tmp_path / f"cand_{name}.py", ctx,
                             [{}, {"b": 3, "d": 17}])


@pytest.mark.parametrize("name", list(DECLINED))
def test_writes_the_plan_cannot_follow_are_declined(tmp_path, name):
    body, why = DECLINED[name]
    (tmp_path / f"{name}.py").write_text(_source(body))
    prop = OfflineSynthesizer("cpu").translate(task_ctx(tmp_path, name), n=1,
                                               rng=random.Random(0))[0]
    assert prop.code is None and why in prop.declined, prop.declined
