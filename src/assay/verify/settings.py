"""The verifier's settings (config/verify/*.yaml), as dataclasses without torch: the Hydra
schema of the verify group and the harness's own config."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


# The choice fields. StrEnum: members compare, hash, format and serialize as their value, so
# code may test ``cfg.policy == "strict"``; a config naming any other value fails at start
# (OmegaConf checks it against the members, whose names are their values).
class Policy(StrEnum):
    strict = "strict"  # custom kernels only
    permissive = "permissive"  # library calls allowed, reported as a share of time


class OnDegenerate(StrEnum):
    reject = "reject"
    flag = "flag"


class Transfer(StrEnum):
    draw = "draw"  # each side draws the input sets from their seeds; outputs as cuda_ipc/host
    host = "host"  # shared memory file
    cuda_ipc = "cuda_ipc"  # device memory, cuda only


class InputDistribution(StrEnum):  # assay.tasks.instantiate.DISTRIBUTIONS
    native = "native"
    large = "large"
    small = "small"
    offset = "offset"
    grid = "grid"

@dataclass
class SandboxLimits:
    memory_gb: float = 32.0  # address space; applied on the cpu target only (CUDA maps far more)
    cpu_s: int = 900
    open_files: int = 1024
    processes: int = 4096
    network: bool = False

@dataclass
class VerifyConfig:
    policy: Policy = Policy.strict
    input_distributions: list[InputDistribution] = field(default_factory=lambda: [
        InputDistribution.native, InputDistribution.native, InputDistribution.large])
    timing_sets: int = 3
    swap_sets: int = 2
    timeout_s: float = 300.0
    allow_tf32: bool = False
    # (rtol, atol) per dtype; atol scales with the reference's RMS so it is unit-free.
    tolerances: dict[str, list[float]] = field(default_factory=lambda: {
        "float32": [1e-4, 1e-5], "float16": [1e-2, 1e-3], "bfloat16": [2e-2, 1e-2],
        "float64": [1e-7, 1e-9], "tf32": [5e-3, 5e-4]})
    # An element also passes when it is within the same tolerances of the float64 reference
    # plus a slack for long reductions: k x the RMS error of the task-dtype reference itself
    # (reference_error_factor) + ulps x u x sqrt(N) x rms (rounding_slack; u: the dtype's unit
    # roundoff, N: the longest reduction of the task, from its matmuls, convolutions, norms and
    # reductions). An honest fp32 sequential sum of 16384 values is off by ~1e-3 absolute where
    # torch's pairwise sum is off by ~5e-5; both pass, and fp32 stays strict elsewhere.
    reference_error_factor: float = 64.0
    rounding_slack: float = 8.0
    # At most this fraction of an output's elements may be off both bounds by no more than
    # rounding at the scale of its largest values (assay.verify.compare.compare_tensor).
    outlier_fraction: float = 1e-6
    # precision: (factor, ulps) per dtype. The candidate's L2 error against the float64
    # reference may not exceed max(factor x the task-dtype reference's own L2 error,
    # ulps x u x sqrt(N) x |r64|): computing in fp16/bf16/tf32 or with approximate math fails.
    precision: dict[str, list[float]] = field(default_factory=lambda: {
        "float32": [32.0, 4.0], "float16": [32.0, 4.0], "bfloat16": [32.0, 4.0],
        "float64": [32.0, 4.0], "tf32": [32.0, 4.0]})
    # Reject a runtime under margin x the roofline floor. The floor's bandwidth is a measured
    # copy rate, not the chip's ceiling: on an H200 (copy 3.9 TB/s) honest row
    # reductions ran at 112% and elementwise kernels at 109% of it, and the datasheet's 4.8 TB/s
    # is 123%. 0.8 (125%) rejects only what no memory system could do.
    roofline_margin: float = 0.8
    on_degenerate: OnDegenerate = OnDegenerate.reject
    max_library_time_frac: float = 1.0  # permissive policy's ceiling
    reject_reference_ops: bool = True  # reference_fallback: the reference's own ops, re-run
    audit: bool = True
    warmup_s: float = 0.05
    min_runs: int = 10
    max_runs: int = 200
    budget_s: float = 0.5
    # Every timed call gets data no call has seen: floating inputs are rescaled by a fresh random
    # factor in [0.8, 1) before each unverified call (verified calls get independent sets).
    perturb_timed_inputs: bool = True
    # How long outputs must stay unchanged after forward returns (work left on a thread shows).
    settle_s: float = 0.02
    # How tensors reach the worker and come back: draw (the worker draws each input set from
    # its seed where it needs it, checked against the harness's digest of it; parameters and
    # outputs through device memory on cuda, a shared memory file on cpu), cuda_ipc (every set
    # copied through device memory shared with CUDA IPC; cuda only: cpu uses host) or host (a
    # shared memory file). The memory plan takes another where that keeps more of the
    # protocol (assay.verify.memory.plan_transfers); a set that draws differently in the
    # worker falls back to host.
    transfer: Transfer = Transfer.draw
    limits: SandboxLimits = field(default_factory=SandboxLimits)
