"""Profiles of one kernel: the torch-profiler kernel list, Nsight Compute, clang-tidy.

Each runs the candidate in its own sandboxed worker (never in this process, never outside the
verifier's sandbox: the profiler itself runs inside it) or reads only its source. Each returns
text for the archive's NCU_Profile / Torch_Profile / Clang_Tidy columns, or None with the reason
logged when the tool is not available here.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from assay.verify.memory import Protocol, check_distributions, lighter_protocols
from assay.verify.sandbox import Outcome, run_sandboxed
from assay.verify.settings import VerifyConfig

if TYPE_CHECKING:
    from assay.verify.reference import Prepared
# torch and the harness are imported where a worker is run: the profile step of a verdict that
# carries its audit's table, with no ncu (the cpu target), reads and writes text only (a torch
# import of 2-2.6 s on the CPU machine, 4-5 s on an H200, for nothing)

NCU_LOG = "ncu.csv"
_SOURCE_BLOCK = re.compile(r"r?(\"\"\"|''')(.*?)\1", re.S)


def kernel_sources(code: str) -> list[str]:
    """The C++/CUDA sources inside a candidate file (triple-quoted strings that look like C)."""
    return [m.group(2) for m in _SOURCE_BLOCK.finditer(code)
            if re.search(r"#include|__global__|extern \"C\"", m.group(2))]


def torch_profile_table(kernels: list[dict[str, Any]], device: str) -> str:
    key = "device_us" if device.startswith("cuda") else "cpu_us"
    rows = sorted(kernels, key=lambda r: -r[key])
    total = sum(r[key] for r in rows) or 1.0
    lines = [f"{'name':60s} {'calls':>6s} {key:>12s} {'share':>7s}"]
    for r in rows[:30]:
        lines.append(f"{r['name'][:60]:60s} {r['count']:6d} {r[key]:12.1f} "
                     f"{r[key] / total:7.1%}")
    return "\n".join(lines)


def light(cfg: VerifyConfig) -> VerifyConfig:
    """The verifier's settings for a profile run: the lightest protocol the worker runs
    (``memory.lighter_protocols``' last: two correctness sets, as its staleness calls need,
    one timing buffer, no swapped sets), so the step prepares three input sets and their
    references, not eight. At KernelBench's sizes the full protocol made L1_41's profile step
    88 s on an H200 (preparation 6 s, the torch-profiler run 40, ncu 37)."""
    lightest = lighter_protocols(Protocol.of(cfg))[-1]
    return dataclasses.replace(cfg, input_distributions=check_distributions(
        cfg.input_distributions, lightest.check_sets), timing_sets=lightest.timing_sets,
        swap_sets=lightest.swap_sets)


def _job_dir(prep: Prepared, candidate: Path, cfg: VerifyConfig, audit: bool) -> Path:
    import torch

    from assay.verify.harness import worker_job

    scratch = Path(tempfile.mkdtemp(prefix="assay-profile-"))
    shutil.copyfile(candidate, scratch / "candidate.py")
    job = worker_job(prep, scratch / "candidate.py", cfg)
    job["audit"] = audit
    job["timing"].update(min_runs=3, max_runs=3, warmup_s=0.0)
    job["result_format"] = "json"  # parsed as data: nothing the candidate wrote is unpickled
    torch.save(job, scratch / "job.pt")
    return scratch


def _report(scratch: Path) -> dict[str, Any] | None:
    """The worker's result.json (written by the candidate's process: plain JSON, or None)."""
    try:
        report = json.loads((scratch / "result.json").read_text())
    except (OSError, ValueError):
        return None
    return report if isinstance(report, dict) else None


@contextmanager
def sandboxed_worker(prep: Prepared, candidate: Path, cfg: VerifyConfig,
                     prefix: Sequence[str] = (), timeout_s: float | None = None,
                     audit: bool = True) -> Iterator[tuple[Outcome, dict | None, Path]]:
    """Run the candidate's worker in the verifier's sandbox (``run_sandboxed``: its environment
    allow-list, namespaces, uid and limits), behind ``prefix`` when a profiler must exec it
    (ncu). The profiler runs inside the sandbox with the candidate: it sees the sandbox's
    environment and its only writable folder is the scratch (its HOME and TMPDIR).

    ``audit``: the worker's own profiler over every call (the torch-profiler table); off under
    ncu, which wants the device's counters to itself. Yields (outcome, the worker's report or
    None, scratch); the scratch is removed after.
    """
    from assay.verify.harness import _private_memory

    scratch = _job_dir(prep, candidate, cfg, audit)
    try:
        cmd = [*prefix, sys.executable, "-m", "assay.verify.worker", str(scratch)]
        with _private_memory():  # as while verifying: this process's memory and environ closed
            outcome = run_sandboxed(cmd, scratch,
                                    cfg.timeout_s if timeout_s is None else timeout_s,
                                    cfg.limits, device=prep.device)
        yield outcome, _report(scratch), scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def torch_profile(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> str | None:
    with sandboxed_worker(prep, candidate, cfg) as (outcome, result, _):
        if result is None or not isinstance(result.get("kernels"), list):
            why = result.get("error", outcome) if result else outcome
            return f"profile run failed: {why}"
        return torch_profile_table(result["kernels"], prep.device)


def kernel_function(name: str) -> str | None:
    """A kernel's function name as ncu's ``--kernel-name-base function`` gives it: no return
    type, namespace, template arguments or parameters (``void scan<4>(float const*, long)``:
    ``scan``); None where the name has no such identifier."""
    head = name.split("(", 1)[0].split("<", 1)[0]
    idents = re.findall(r"[A-Za-z_]\w*", head)
    return idents[-1] if idents else None


def ncu_command(ncu: str, metrics: list[str], kernels: Sequence[str] = ()) -> list[str]:
    """The Nsight Compute prefix: metrics as CSV into ``ncu.csv`` in the scratch folder (the
    sandbox's working directory), so the worker's own output cannot mix into it. ``kernels``
    (the verdict's ``kernels_launched``): only launches of those functions are profiled, twice
    as many as there are functions (ncu's ``--launch-count`` counts every matched launch: two
    of each where each launches as often; a kernel launched several times per call takes more
    of them); without them, the first 20 launches of any kernel. Each profiled launch is
    replayed once per counter pass with the memory it writes saved and restored, and at
    KernelBench's sizes most of the first 20 were the harness's own fills and copies of
    gigabyte buffers: the ncu run held an H200 21-62 s per task, for one launch of each of
    the candidate's kernels."""
    names = [kernel_function(k) for k in kernels]
    unique = sorted(set(names)) if all(names) else []
    cmd = [ncu, "--metrics", ",".join(metrics)]
    # (the names come from the worker's report: more than ten of them, two launches each,
    # would pass the 20 launches of the unfiltered run, and a forged list has no length limit)
    if 0 < len(unique) <= 10:
        cmd += ["--kernel-name-base", "function",
                # unanchored: whether ncu's function base keeps a namespace or template
                # arguments, the identifier is in it
                "--kernel-name", "regex:(" + "|".join(map(re.escape, unique)) + ")",
                "--launch-count", str(2 * len(unique))]
    else:
        cmd += ["--launch-count", "20"]
    return cmd + ["--csv", "--target-processes", "all", "--log-file", NCU_LOG]


def ncu_profile(prep: Prepared, candidate: Path, cfg: VerifyConfig, metrics: list[str],
                timeout_s: float, kernels: Sequence[str] = ()) -> str | None:
    """Nsight Compute metrics of the candidate's kernels (``kernels``: their names, from its
    verdict), ncu and the worker both inside the sandbox. What comes back was written inside
    the sandbox (the candidate could write the same file): it is archived for people to read,
    never part of a verdict."""
    ncu = shutil.which("ncu")
    if ncu is None or not prep.device.startswith("cuda"):
        return None
    with sandboxed_worker(prep, candidate, cfg, ncu_command(ncu, metrics, kernels), timeout_s,
                          audit=False) as (outcome, _, scratch):
        if outcome.status == "timeout":
            return f"ncu timed out after {timeout_s:.0f} s"
        try:
            text = (scratch / NCU_LOG).read_text(errors="replace")
        except OSError:
            text = ""
        summary = summarize_ncu_csv(text)
        return summary or (f"ncu gave no metrics for the candidate's kernels: "
                           f"{(text or outcome)[-500:]}")


def summarize_ncu_csv(text: str) -> str:
    """One line per (candidate kernel, metric), averaged over its launches. The harness's own
    kernels (ATen fills and copies) are left out: they are not the candidate's."""
    import csv
    import io
    from collections import defaultdict

    from assay.verify.policy import LIBRARY_KERNEL

    rows = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not rows:
        return ""
    values: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        name = r.get("Kernel Name", "")
        if LIBRARY_KERNEL.search(name):
            continue
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        values[(name, r["Metric Name"], r.get("Metric Unit", ""))].append(value)
    lines = [f"{k[0][:70]} | {k[1]} = {sum(v) / len(v):.4g} {k[2]} (n={len(v)})"
             for k, v in sorted(values.items())]
    return "\n".join(lines)


def clang_tidy(code: str, target: str, timeout_s: float = 120) -> str | None:
    tidy = shutil.which("clang-tidy")
    if tidy is None:
        return None
    out = []
    with tempfile.TemporaryDirectory(prefix="assay-tidy-") as tmp:
        for i, src in enumerate(kernel_sources(code)):
            cuda = "__global__" in src or target == "cuda"
            path = Path(tmp) / (f"k{i}.cu" if cuda else f"k{i}.cpp")
            path.write_text(src)
            args = ["-x", "cuda", "--cuda-host-only", "-nocudalib", "-nocudainc"] if cuda \
                else ["-std=c++17", "-fopenmp"]
            proc = subprocess.run([tidy, str(path), "--checks=-*,bugprone-*,performance-*,"
                                   "readability-*,-readability-magic-numbers,"
                                   "-readability-identifier-length", "--", *args],
                                  capture_output=True, text=True, timeout=timeout_s)
            out.append(proc.stdout.replace(str(path), path.name).strip())
    return "\n".join(o for o in out if o) or "clang-tidy: no findings"
