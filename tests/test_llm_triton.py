"""LLM prompts for target=triton (translate, mutate, crossover, repair), through the real
LiteLLMProposer against the scripted server on 127.0.0.1 (test_llm's loopback audit applies
here too): the Triton toolchain and its accuracy rules in the system prompt, and in repair the
error Triton itself raised, taken from a verdict the verifier wrote for a broken kernel.
"""

from __future__ import annotations

import pytest

from assay.propose import prompts as P
from assay.propose.base import TaskContext
from assay.records import Verdict
from test_llm import (CANDIDATE, TASK_SOURCE, answer, api_key, loopback_only,  # noqa: F401
                      make, parent, task)
from test_llm import ScriptedLLMServer

BROKEN = '''import torch
import triton
import triton.language as tl
from torch import nn


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.where(x < 0.0, 0.0, x), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.numel()
        relu_kernel[(triton.cdiv(n, 1000),)](x, y, n, BLOCK=1000)  # not a power of two
        return y
'''


@pytest.fixture
def ctx(task) -> TaskContext:
    return TaskContext(task=task, target="triton")


def test_the_triton_system_prompt_teaches_tritons_toolchain_and_accuracy(task):
    msgs = P.render("translate", target="triton", task_id=task.id, task_source=task.source)
    system = msgs[0]["content"]
    for must in ("expert Triton performance engineer", "@triton.jit", "triton.cdiv",
                 'input_precision="ieee"', "tl.math.div_rn", "libdevice", "interpreter",
                 "@triton.autotune", "state_dict", "torch.compile"):
        assert must in system, must
    for other in ("load_library", "cudaStream_t", "OpenMP"):
        assert other not in system, other
    cuda = P.render("translate", target="cuda", task_id=task.id, task_source=task.source)
    assert "@triton.jit" not in cuda[0]["content"]  # the other targets' prompts are unchanged


@pytest.fixture(scope="module")
def triton_verdict(tmp_path_factory) -> dict:
    """A verdict the verifier wrote for a kernel Triton rejects (its interpreter, on cpu)."""
    pytest.importorskip("triton")
    from test_zoo import prepared, zoo_config, zoo_task

    from assay.verify.harness import verify

    path = tmp_path_factory.mktemp("broken") / "broken_triton.py"
    path.write_text(BROKEN)
    zoo = zoo_task("level1/1_gelu")
    v = verify(zoo, path, "cpu", zoo_config({"POLICY": "strict", "CONFIG": {}}),
               prepared=prepared(zoo))
    assert v.reasons == ["runs"], v.reasons
    return v.to_dict()


def test_repair_sends_tritons_own_error_and_the_triton_hints(ctx, triton_verdict):
    verdict = dict(Verdict.from_dict(triton_verdict).to_dict())
    broken = parent("cbroken", code=BROKEN, **{k: verdict[k] for k in
                                                ("accepted", "reasons", "checks", "error")})
    good = parent("cgood", code=BROKEN.replace("1000", "1024"))
    with ScriptedLLMServer([answer(BROKEN.replace("1000", "1024"))] * 4) as server:
        prop = make(server, target="triton")
        [r] = prop.repair(ctx, broken, None)
        [m] = prop.mutate(ctx, good, 1, None)
        [c] = prop.crossover(ctx, [good, parent("cother", code=CANDIDATE)], None)
        [t] = prop.translate(ctx, 1, None)
        requests = [q["json"]["messages"] for q in server.requests]
    repair_user = requests[0][1]["content"]
    assert "arange's range must be a power of 2" in repair_user  # Triton's message, verbatim
    assert "Triton compiles a kernel at its first launch" in repair_user
    assert "failed check: runs" in repair_user and "BLOCK=1000" in repair_user
    assert "num_warps and num_stages" in requests[1][1]["content"]
    for messages in requests:
        assert "expert Triton performance engineer" in messages[0]["content"]
        assert "(target: triton)" in messages[1]["content"]
    assert TASK_SOURCE.strip() in requests[3][1]["content"]
    for p in (r, m, c, t):
        assert p.code is not None and "@triton.jit" in p.code
