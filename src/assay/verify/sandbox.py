"""Run an untrusted command: its own session, a scratch cwd, resource limits, no network.

Limits are set in the child before exec (``preexec_fn``). The network is cut with a new network
namespace where the kernel lets us create one (root, or unprivileged user namespaces); where it
does not, the command still runs and the outcome says so, so the verdict records the refusal.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
import subprocess
from pathlib import Path

from assay.verify.settings import SandboxLimits

CLONE_NEWNET = 0x40000000


def candidate_env() -> dict[str, str]:
    """The environment the worker sees: no API keys, nothing the candidate needs to reach."""
    keep = ("PATH", "HOME", "LANG", "LC_ALL", "PYTHONPATH", "CUDA_VISIBLE_DEVICES", "CUDA_HOME",
            "ASSAY_KERNEL_CACHE", "ASSAY_CUDA_ARCH", "CXX", "NVCC", "TMPDIR", "OMP_NUM_THREADS",
            "LD_LIBRARY_PATH", "VIRTUAL_ENV", "TORCH_EXTENSIONS_DIR", "MKL_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _limit(limits: SandboxLimits, device: str):
    def apply() -> None:
        os.setsid()
        if device == "cpu" and limits.memory_gb:
            n = int(limits.memory_gb * (1 << 30))
            resource.setrlimit(resource.RLIMIT_AS, (n, n))
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.open_files, limits.open_files))
        if not limits.network:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.unshare(CLONE_NEWNET) != 0:
                os.environ["ASSAY_SANDBOX_NETWORK"] = "shared"  # seen by the worker
    return apply


def run_sandboxed(cmd: list[str], cwd: Path, timeout_s: float, limits: SandboxLimits,
                  device: str = "cpu") -> str:
    """Run ``cmd``; return "ok", "timeout after N s", or "exit N: <stderr tail>"."""
    log = cwd / "worker.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=candidate_env(), stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=_limit(limits, device))
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            return f"timeout after {timeout_s:.0f} s (the candidate did not finish)"
        finally:
            _kill_group(proc)  # anything it left behind in its session
    if code == 0:
        return "ok"
    tail = log.read_bytes()[-1500:].decode(errors="replace").strip()
    if code < 0:
        return f"killed by signal {signal.Signals(-code).name}: {tail}"
    return f"exit {code}: {tail}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass
