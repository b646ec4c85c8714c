"""Build realistic fake results trees for the consumers' tests (collect, export, report, compare,
track). Nothing here runs torch: the files are written as the pipeline's steps would write them.

``make_fake_campaign`` writes a whole campaign with a known pattern; ``write_task``,
``add_candidate``, ``add_declined``, ``add_pending`` and ``add_profile`` craft exact data.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from assay.evolve.functional import functional_paths
from assay.layout import Campaign, read_json, write_atomic, write_json
from assay.records import Proposal, Verdict
from assay.verify import checks

# The checks every fake verdict records (all registry names: checks.record refuses others).
CHECKS = ("compiles", "constructs", "runs", "correctness", "kernel_audit", "roofline")

TASK_NAMES = {
    1: ["ReLU", "GELU", "Softmax", "Matmul", "LayerNorm", "Sum_reduction"],
    2: ["Conv2d_ReLU_BiasAdd", "Gemm_Scale_Sigmoid", "Matmul_Dropout_Mean", "Conv3d_Min_Softmax"],
}

TASK_SOURCE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    """{name}: a task of level {level}."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) if x.numel() < 0 else x * (x > 0)


batch_size = 16
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
'''

CANDIDATE_SOURCE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# candidate {tag}
cuda_src = r"""
__global__ void k_{ident}(const float* __restrict__ x, float* __restrict__ y, int n) {{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && x[i] > 0.f) y[i] = x[i]; else if (i < n) y[i] = 0.f;
}}
"""


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clamp_min(0)  # <stand-in for the compiled op & friends>
'''


def write_task(campaign: Campaign, level: int, number: int, name: str, *,
               eager_ms: float = 1.0, compile_ms: float | None = 0.8,
               functional: bool = True, error: str | None = None,
               target: str = "cpu", device: str = "fake-cpu", flops: float = 16384.0,
               min_bytes: float = 131072.0) -> str:
    """Write a task record and its baseline; returns the task id."""
    tid = f"L{level}_{number}_{name}"
    source = TASK_SOURCE.format(name=name, level=level)
    write_json(campaign.task_record(tid), {
        "id": tid, "level": level, "number": number, "name": name,
        "path": f"data/tasks/level{level}/{number}_{name}.py",
        "source_hash": hashlib.sha256(source.encode()).hexdigest()[:16],
        "size": "small", "source": source,
        "functional_source": ("def module_fn(x):\n    return x.clamp_min(0)\n"
                              if functional else None),
        "inputs": [{"shape": [16, 1024], "dtype": "float32"}],
        "flops": flops, "min_bytes": min_bytes,
        "degeneracy": {"constant_output": False}, "error": error,
    })
    write_json(campaign.baseline(tid), {"eager_ms": eager_ms, "compile_ms": compile_ms,
                                        "device": device, "target": target})
    return tid


def _update_gen_index(campaign: Campaign, llm: str, task: str, gen: int,
                      proposal: Proposal, verdict: dict[str, Any] | None) -> None:
    """Keep proposals.json and verdicts.json in the formats translate/evolve and verify write."""
    ppath = campaign.proposals(llm, task, gen)
    summary = read_json(ppath) if ppath.exists() else {
        "generation": gen, "llm": llm, "task": task, "candidates": [], "declined": [],
        "tokens": 0, "cost_usd": 0.0}
    if proposal.code is None:
        summary["declined"].append({"operator": proposal.operator, "parents": proposal.parents,
                                    "reason": proposal.declined or "no code"})
    elif proposal.id not in summary["candidates"]:
        summary["candidates"].append(proposal.id)
    summary["tokens"] += proposal.tokens_in + proposal.tokens_out
    summary["cost_usd"] += proposal.cost_usd
    write_json(ppath, summary)
    if verdict is not None:
        vpath = campaign.verdicts(llm, task, gen)
        vs = read_json(vpath) if vpath.exists() else {
            "generation": gen, "candidates": [], "accepted": [], "best_speedup_eager": None}
        vs["candidates"].append(verdict["candidate"])
        if verdict["accepted"]:
            vs["accepted"].append(verdict["candidate"])
            vs["best_speedup_eager"] = max(vs["best_speedup_eager"] or 0,
                                           verdict["speedup_eager"] or 0)
        write_json(vpath, vs)


def _write_proposal(campaign: Campaign, llm: str, task: str, gen: int, proposal: Proposal
                    ) -> str:
    cid = proposal.id
    assert cid is not None
    rec = read_json(campaign.task_record(task))
    code_path, rec_path = functional_paths(campaign, llm, task)
    if rec.get("functional_source") and not rec_path.exists():  # stage 1, as translate writes it
        write_atomic(code_path, rec["functional_source"])
        write_json(rec_path, {"accepted": True, "reasons": [], "detail": ""})
    write_atomic(campaign.candidate(llm, task, gen, cid), proposal.code or "")
    write_json(campaign.proposal_meta(llm, task, gen, cid), proposal.meta(gen, llm, task))
    return cid


def add_candidate(campaign: Campaign, llm: str, task: str, gen: int, *, accepted: bool,
                  speedup: float | None = None, speedup_compile: float | None = None,
                  reasons: tuple[str, ...] | list[str] = (), error: str = "",
                  tokens: tuple[int, int] = (1000, 400), cost: float = 0.01,
                  parents: tuple[str, ...] | list[str] = (), tag: str = "",
                  roofline_ms: float | None = 0.1, max_abs_err: float | None = 1e-6,
                  policy: str = "strict", device: str = "fake-cpu",
                  operator: str | None = None) -> str:
    """Write one candidate (code, proposal meta, verdict); returns its id.

    ``speedup`` is over eager; runtime_ms is the baseline's eager_ms / speedup.
    """
    base = read_json(campaign.baseline(task))
    ident = f"{llm}_{task}_{gen}_{tag}".replace("-", "_")
    code = CANDIDATE_SOURCE.format(tag=f"{llm}/{task}/gen{gen}/{tag}", ident=ident)
    op = operator or ("translate" if gen == 0 else ("mutate" if parents else "repair"))
    proposal = Proposal(code=code, operator=op, parents=list(parents), strategy="fusion",
                        knobs={"block": 256}, model=f"{llm}-model", tokens_in=tokens[0],
                        tokens_out=tokens[1], cost_usd=cost, wall_s=2.5)
    cid = _write_proposal(campaign, llm, task, gen, proposal)
    runtime = base["eager_ms"] / speedup if speedup else None
    v = Verdict(candidate=cid, task=task, device=device, policy=policy, error=error,
                verify_s=1.5)
    failed = set(reasons)
    for name in CHECKS + tuple(r for r in reasons if r not in CHECKS):
        checks.record(v, name, name not in failed, "" if name not in failed else f"{name} failed")
    v.finish()
    assert v.accepted == accepted, (accepted, reasons)
    v.max_abs_err = max_abs_err
    v.rel_err = None if max_abs_err is None else max_abs_err / 2
    v.runtime_ms = runtime
    v.runtime_iqr_ms = None if runtime is None else runtime * 0.01
    v.baseline_eager_ms = base["eager_ms"]
    v.baseline_compile_ms = base["compile_ms"]
    v.speedup_eager = speedup
    v.speedup_compile = speedup_compile if speedup_compile is not None else (
        base["compile_ms"] / runtime if runtime and base["compile_ms"] else None)
    v.roofline_ms = roofline_ms if runtime is not None else None
    v.kernels_launched = [f"k_{ident}"] if runtime is not None else []
    v.library_time_frac = 0.0 if runtime is not None else None
    d = v.to_dict()
    write_json(campaign.verdict(llm, task, gen, cid), d)
    _update_gen_index(campaign, llm, task, gen, proposal, d)
    return cid


def add_declined(campaign: Campaign, llm: str, task: str, gen: int, reason: str = "refused",
                 tokens: tuple[int, int] = (300, 20), cost: float = 0.002) -> None:
    """A declined proposal: no code, no candidate files; listed (and its tokens counted) in
    the generation's proposals.json, as write_generation does."""
    p = Proposal(code=None, declined=reason, model=f"{llm}-model", tokens_in=tokens[0],
                 tokens_out=tokens[1], cost_usd=cost)
    _update_gen_index(campaign, llm, task, gen, p, None)


def add_pending(campaign: Campaign, llm: str, task: str, gen: int, tag: str = "pending",
                tokens: tuple[int, int] = (500, 100), cost: float = 0.003) -> str:
    """A proposal whose verdict is not written yet."""
    code = CANDIDATE_SOURCE.format(tag=f"{llm}/{task}/gen{gen}/{tag}", ident=f"pending_{gen}")
    p = Proposal(code=code, operator="mutate", tokens_in=tokens[0], tokens_out=tokens[1],
                 cost_usd=cost)
    cid = _write_proposal(campaign, llm, task, gen, p)
    _update_gen_index(campaign, llm, task, gen, p, None)
    return cid


def add_profile(campaign: Campaign, llm: str, task: str, cid: str | None) -> None:
    """profile.json as the profile step writes it (all null when there is nothing to profile)."""
    write_json(campaign.profile(llm, task), {
        "task": task, "llm": llm, "candidate": cid,
        "ncu": None if cid is None else
        "==PROF== ncu report\n  Duration  usecond  12.3\n  DRAM Throughput  % 81.2\n",
        "torch_profile": None if cid is None else
        "Name  Self CPU %  CUDA total\nk_relu  1.0%  12.3us\n",
        "clang_tidy": None,
    })


FAKE_DEVICE = {"name": "fake-cpu", "bandwidth_gbs": 2.0, "flops_tflops": 0.2,
               "measured_with": {"copy_mb": 256, "matmul_fp32": 1024}}


def roofline_ms(flops: float, min_bytes: float, device: dict[str, Any] = FAKE_DEVICE) -> float:
    """The verifier's floor, max(bytes / bandwidth, FLOPs / peak), in ms."""
    return 1e3 * max(min_bytes / (device["bandwidth_gbs"] * 1e9),
                     flops / (device["flops_tflops"] * 1e12))


def add_tracked(campaign: Campaign, llm: str, task: str, experiment_id: str = "7") -> dict:
    """``<llm>/<task>/tracked.json`` as the track step writes it (ids made up, deterministic)."""
    run = hashlib.sha256(f"{campaign.name}/{llm}/{task}".encode()).hexdigest()[:32]
    parent = hashlib.sha256(f"{campaign.name}/{llm}".encode()).hexdigest()[:32]
    data = {"tracking_uri": "sqlite:///results/mlflow.db", "experiment": campaign.name,
            "experiment_id": experiment_id, "parent_run_id": parent, "run_id": run}
    write_json(campaign.tracked(llm, task), data)
    return data


def make_fake_campaign(root: Path, name: str = "test",
                       llms: tuple[str, ...] = ("offline", "fakellm"), tasks: int = 3,
                       gens: int = 2, tracked: bool = False) -> Campaign:
    """A campaign at ``root/name``: ``tasks`` tasks alternating levels 1 and 2, ``gens``
    generations, per (llm, task, gen) three verified candidates:

    - ``a``: accepted, speedup_eager = 0.5 + 0.5 * (llm index + task index + gen);
      from gen 1 on a crossover of the previous generation's ``a`` and ``w``;
    - ``w``: rejected for ``correctness`` (max_abs_err 0.25), untimed; from gen 1 on a
      mutation of the previous generation's ``a``;
    - ``e``: rejected for ``compiles`` with an error message, untimed; from gen 1 on a repair
      of the previous generation's ``w``;

    except the last task of the last llm (when there are >= 2 llms), where ``a`` is rejected too
    (reason ``roofline``) so one (llm, task) has no accepted kernel. Tokens: ``a`` 1000 + 10 * gen
    in, 400 out; ``w`` and ``e`` 1000 in, 400 out; cost 0.01 * (llm index + 1) for ``a``, 0.01
    for the others. Also, in gen 0 of the first (llm, task): one declined proposal (320 tokens,
    $0.002) and one pending, unverified proposal (600 tokens, $0.003); and a profile.json for
    that (llm, task)'s best kernel; the (llm, task) with no accepted kernel gets the profile.json
    the profile step writes then (candidate null).

    Task ``ti`` does 2 ** (14 + 4 ti) FLOPs on 128 KiB (arithmetic intensity 1/8, 2, 32, ...);
    ``device.json`` is ``FAKE_DEVICE`` and the timed candidates' roofline_ms follows from both.
    ``tracked``: also write every (llm, task)'s tracked.json (``add_tracked``).
    """
    campaign = Campaign(Path(root) / name)
    write_json(campaign.device(), FAKE_DEVICE)
    write_atomic(campaign.root / "config.yaml", "campaign: test\nllm:\n  name: offline\n")
    counters = {1: 0, 2: 0}
    task_ids = []
    floors = {}
    for ti in range(tasks):
        level = 1 if ti % 2 == 0 else 2
        counters[level] += 1
        number = counters[level]
        tname = TASK_NAMES[level][(number - 1) % len(TASK_NAMES[level])]
        flops, min_bytes = float(2 ** (14 + 4 * ti)), 131072.0
        tid = write_task(campaign, level, number, tname, eager_ms=1.0 + ti,
                         compile_ms=0.8 + ti, flops=flops, min_bytes=min_bytes)
        task_ids.append(tid)
        floors[tid] = roofline_ms(flops, min_bytes)
    for li, llm in enumerate(llms):
        for ti, task in enumerate(task_ids):
            no_accept = len(llms) >= 2 and li == len(llms) - 1 and ti == len(task_ids) - 1
            best: tuple[float, str] | None = None
            prev: dict[str, str] = {}
            for g in range(gens):
                speedup = 0.5 + 0.5 * (li + ti + g)
                a = add_candidate(campaign, llm, task, g, accepted=not no_accept,
                                  speedup=speedup, reasons=("roofline",) if no_accept else (),
                                  parents=[prev["a"], prev["w"]] if prev else [],
                                  operator="crossover" if prev else None,
                                  tag="a", tokens=(1000 + 10 * g, 400),
                                  cost=0.01 * (li + 1), roofline_ms=floors[task])
                w = add_candidate(campaign, llm, task, g, accepted=False, speedup=None,
                                  reasons=("correctness",), max_abs_err=0.25,
                                  parents=[prev["a"]] if prev else [],
                                  operator="mutate" if prev else None,
                                  tag="w", roofline_ms=None)
                add_candidate(campaign, llm, task, g, accepted=False, speedup=None,
                              reasons=("compiles",), max_abs_err=None, tag="e",
                              error="nvcc: error: identifier \"__shfl\" is undefined",
                              parents=[prev["w"]] if prev else [],
                              operator="repair" if prev else None, roofline_ms=None)
                prev = {"a": a, "w": w}
                if not no_accept and (best is None or speedup > best[0]):
                    best = (speedup, a)
            if li == 0 and ti == 0:
                add_declined(campaign, llm, task, 0)
                add_pending(campaign, llm, task, 0)
                assert best is not None
                add_profile(campaign, llm, task, best[1])
            if no_accept:
                add_profile(campaign, llm, task, None)
            if tracked:
                add_tracked(campaign, llm, task)
    return campaign
