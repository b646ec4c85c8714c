"""The verifier's settings (config/verify/*.yaml), as dataclasses without torch: the Hydra
schema of the verify group and the harness's own config."""

from __future__ import annotations

from dataclasses import dataclass, field

@dataclass
class SandboxLimits:
    memory_gb: float = 32.0  # address space; applied on the cpu target only (CUDA maps far more)
    cpu_s: int = 900
    open_files: int = 1024
    processes: int = 4096
    network: bool = False

@dataclass
class VerifyConfig:
    policy: str = "strict"  # strict: custom kernels only; permissive: library calls reported
    input_distributions: list[str] = field(default_factory=lambda: ["native", "native", "large"])
    timing_sets: int = 3
    swap_sets: int = 2
    timeout_s: float = 300.0
    allow_tf32: bool = False
    # (rtol, atol) per dtype; atol scales with the reference's RMS so it is unit-free.
    tolerances: dict[str, list[float]] = field(default_factory=lambda: {
        "float32": [1e-4, 1e-5], "float16": [1e-2, 1e-3], "bfloat16": [2e-2, 1e-2],
        "float64": [1e-7, 1e-9], "tf32": [5e-3, 5e-4]})
    roofline_margin: float = 0.9  # reject a runtime under margin x the roofline floor
    on_degenerate: str = "reject"  # reject | flag
    max_library_time_frac: float = 1.0  # permissive policy's ceiling
    audit: bool = True
    warmup_s: float = 0.05
    min_runs: int = 10
    max_runs: int = 200
    budget_s: float = 0.5
    limits: SandboxLimits = field(default_factory=SandboxLimits)
