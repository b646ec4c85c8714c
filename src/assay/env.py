"""Every ``ASSAY_*`` environment variable the code reads, with what it does.

Settings of a campaign (timeouts, sizes, budgets, policies) live in the Hydra config, where
the campaign's folder records them. What is left here are knobs of the process or the machine
that a config cannot carry: where the config itself is, the host's sandbox uids and kernel
cache, the GPU lock folder, and the markers one Assay process sets for the processes it
starts. README ("Environment variables") lists the same table; a test keeps the two and the
names read under src/ in step.

New code reads them through ``VAR.get()`` rather than ``os.environ`` so each has one name and
one default (the readers in bench/, gpu.py, verify/ and report/ predate this module).
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class EnvVar:
    name: str
    doc: str
    default: str = ""
    internal: bool = False  # set by Assay for its own child processes, not by users

    def get(self) -> str:
        """The variable's value, or its default when unset or empty."""
        return os.environ.get(self.name) or self.default

    def is_set(self) -> bool:
        return bool(os.environ.get(self.name))


CONFIG_DIR = EnvVar(
    "ASSAY_CONFIG_DIR",
    "the Hydra config folder to compose instead of the one inside the package (a copy you edit "
    "outside the checkout; tests point it at a folder of their own)")
KERNEL_CACHE = EnvVar(
    "ASSAY_KERNEL_CACHE",
    "the shared cache of built kernels (default ~/.cache/assay/kernels)")
BASELINE_CACHE = EnvVar(
    "ASSAY_BASELINE_CACHE",
    "the cache of eager/compile baseline timings and task records per (task, device, torch "
    "version): `assay verify`'s, and the verify step's baseline of its own GPU where the "
    "campaign's names another (default ~/.cache/assay/baselines; `benchmarks/gpu_phases.sh` "
    "keeps it in its carried state)")
CUDA_ARCH = EnvVar(
    "ASSAY_CUDA_ARCH",
    "the architecture kernels are built for, e.g. sm_90 (default: the visible GPU's); the "
    "compile service pins it so builds without a GPU match the verifying one")
GPU_LOCK_DIR = EnvVar(
    "ASSAY_GPU_LOCK_DIR",
    "the folder of the per-GPU lock files that steps on one host share (default "
    "$TMPDIR/assay-gpu)")
SANDBOX_UID = EnvVar(
    "ASSAY_SANDBOX_UID",
    "first uid of the sandbox's range (the harness's gid; workers take uid+1..uid+slots); pick a "
    "range no account of this host uses")
SANDBOX_DISABLE = EnvVar(
    "ASSAY_SANDBOX_DISABLE",
    "comma list of sandbox layers to turn off (uid,mount,pidns,net,cgroup): tests of the "
    "fallbacks only; verdicts then say `sandbox incomplete`")
SANDBOX_PRIVATE_CACHE = EnvVar(
    "ASSAY_SANDBOX_PRIVATE_CACHE",
    "1: each sandboxed run builds into a private kernel cache (slower, nothing shared between "
    "candidates)")
SANDBOX_ZYGOTE = EnvVar(
    "ASSAY_SANDBOX_ZYGOTE",
    "unset or 1: each sandboxed worker is forked from a process that imported torch already "
    "(2.5-3 s less per cpu verification here, 4-5 s on a GPU); 0: a fresh interpreter per "
    "worker")
STEP_SERVER = EnvVar(
    "ASSAY_STEP_SERVER",
    "unset or 1: each step of the DAG is forked from a server that imported torch already "
    "(one per interpreter, environment and folder; 2.5-4.5 s less per job on the CPU machine); "
    "0: each step imports it itself (always so inside a SLURM job)")
STEP_SERVER_IDLE = EnvVar(
    "ASSAY_STEP_SERVER_IDLE",
    "seconds a step server waits for the next step before it exits", "30")
MLFLOW_UI = EnvVar(
    "ASSAY_MLFLOW_UI",
    "base URL of the MLflow UI that `assay report` links to when --mlflow-ui is not given "
    "(the pipeline's report step reads mlflow.ui_url from the config)")
SLURM_PARTITION = EnvVar(
    "ASSAY_SLURM_PARTITION",
    "SLURM partition of the `slurm` workflow profile (unset: the cluster's default)")
SLURM_ACCOUNT = EnvVar(
    "ASSAY_SLURM_ACCOUNT",
    "SLURM account of the `slurm` workflow profile (unset: the cluster's default)")
GPU = EnvVar(
    "ASSAY_GPU",
    "the GPU this process holds a lease on (set by assay.gpu.acquire)", internal=True)
BUILD_ONLY = EnvVar(
    "ASSAY_BUILD_ONLY",
    "1: load_library builds and returns a stub (the compile service's prebuild)", internal=True)
SANDBOX_NETWORK = EnvVar(
    "ASSAY_SANDBOX_NETWORK",
    "the worker's network isolation as the launcher applied it, for the verdict",
    internal=True)

HOST_SHARE = EnvVar(
    "ASSAY_HOST_SHARE",
    "how many runs share this host's memory (one per GPU: benchmarks/gpu_phases.sh's "
    "self-check shards): each memory plan takes that part of the available host memory",
    "1")

ALL: tuple[EnvVar, ...] = (CONFIG_DIR, KERNEL_CACHE, BASELINE_CACHE, CUDA_ARCH, GPU_LOCK_DIR,
                           SANDBOX_UID, SANDBOX_DISABLE, SANDBOX_PRIVATE_CACHE, SANDBOX_ZYGOTE,
                           STEP_SERVER, STEP_SERVER_IDLE, MLFLOW_UI,
                           SLURM_PARTITION, SLURM_ACCOUNT, GPU, BUILD_ONLY, SANDBOX_NETWORK,
                           HOST_SHARE)


def markdown_table() -> str:
    """The README's table of these variables."""
    rows = ["| variable | what it does |", "|---|---|"]
    for v in ALL:
        doc = v.doc + (" (internal: set by Assay for its child processes)" if v.internal else "")
        rows.append(f"| `{v.name}` | {doc} |")
    return "\n".join(rows)
