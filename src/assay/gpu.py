"""GPU lease: which device each GPU job of a campaign uses, and when it may use it; and the CPU
lease: one flock for the whole machine, so two timing steps on the cpu target never share it.

Snakemake's ``--resources gpu=N`` bounds how many GPU jobs run at once. :func:`acquire` gives
each one a place on a device (an flock per place: every GPU's first place before any second
one, so N jobs on N GPUs get one each) and sets ``CUDA_VISIBLE_DEVICES`` before CUDA is
initialized in this process. :func:`hold_device` then takes that device alone, from the job's
first use of it until the process ends: jobs placed on one GPU start up, read their inputs
and build kernels side by side, and use the device one at a time (its memory plans count on
that). With ``gpu`` at twice the GPUs, the next job is ready when the device comes free.
The kernel drops every lock when its process dies, SIGKILL included, so a killed job never
leaves a GPU taken. Under SLURM (``SLURM_JOB_ID`` set) the scheduler has already given the job
its own devices, so the lease takes the first visible one without a lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from assay.layout import try_flock

_held: list[int] = []  # file descriptors kept open for the life of the process
_device_held: list[int] = []
_cpu_held: list[int] = []


def lock_dir() -> Path:
    d = Path(os.environ.get("ASSAY_GPU_LOCK_DIR") or Path(tempfile.gettempdir()) / "assay-gpu")
    d.mkdir(parents=True, exist_ok=True)
    return d


def _nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's output, None where it is missing, fails or hangs: the driver's answer,
    without starting CUDA in this process."""
    try:
        out = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def visible_gpus() -> list[str]:
    """The GPUs this job may choose from: CUDA_VISIBLE_DEVICES if set, else nvidia-smi's list."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d for d in env.split(",") if d.strip() != ""]
    out = _nvidia_smi("-L") or ""
    return [str(i) for i, ln in enumerate(out.splitlines()) if ln.startswith("GPU ")]


def driver_arch() -> str | None:
    """``sm_XY`` of the first visible GPU as the driver reports it (nvidia-smi, by the index or
    UUID CUDA_VISIBLE_DEVICES names), or None where it does not say."""
    dev = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0].strip() or "0"
    out = _nvidia_smi("--query-gpu=compute_cap", "--format=csv,noheader", "-i", dev)
    m = re.fullmatch(r"(\d+)\.(\d+)", (out or "").strip())
    return f"sm_{m.group(1)}{m.group(2)}" if m else None


# Places per GPU :func:`acquire` tries: more jobs than GPUs x this wait for a place.
PLACES_PER_GPU = 16


def _wait_flock(path: Path, what: str, timeout_s: float, poll_s: float) -> tuple[int, float]:
    """:func:`assay.layout.try_flock` until it is taken: (its descriptor, the seconds waited)."""
    start = time.monotonic()
    while (fd := try_flock(path, 0o666)) is None:
        if time.monotonic() - start > timeout_s:
            try:  # the holder wrote its pid there (try_flock)
                holder = f" (held by pid {int(Path(path).read_text().split()[0])})"
            except (OSError, ValueError, IndexError):
                holder = ""
            raise TimeoutError(f"{what} ({path}) did not come free in {timeout_s:.0f} s"
                               f"{holder}")
        time.sleep(poll_s)
    return fd, time.monotonic() - start


def acquire(timeout_s: float = 24 * 3600, poll_s: float = 1.0) -> str | None:
    """Take a place on a GPU (the first free place, every GPU's first place before any second
    one) and make that GPU the only visible one; None when there is no GPU. The device itself
    is taken by :func:`hold_device`."""
    if _held and os.environ.get("ASSAY_GPU"):
        return os.environ["ASSAY_GPU"]  # this process holds a lease already (an flock taken
        # twice by one process on two descriptors would wait for itself)
    gpus = visible_gpus()
    if not gpus:
        return None
    if os.environ.get("SLURM_JOB_ID") and os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        # SLURM already gave this job its own devices (--gpus); their indices restart at 0 in
        # every job, so a lock named by index would make jobs on one node wait for each other.
        os.environ["ASSAY_GPU"] = gpus[0]
        return gpus[0]
    deadline = time.monotonic() + timeout_s
    while True:
        for place in range(PLACES_PER_GPU):
            for dev in gpus:
                fd = try_flock(lock_dir() / f"gpu-{dev}.place{place}.lock", 0o666)
                if fd is None:
                    continue
                _held.append(fd)
                os.environ["CUDA_VISIBLE_DEVICES"] = dev
                os.environ["ASSAY_GPU"] = dev
                return dev
        if time.monotonic() > deadline:
            raise TimeoutError(f"no GPU of {gpus} came free in {timeout_s:.0f} s")
        time.sleep(poll_s)


def device_lock() -> Path | None:
    """The lock :func:`hold_device` would take in this process (None where it takes none).
    Handed to a child process that does this job's device work, which takes it itself
    (:func:`hold_device_lock`) once its imports are done, so they run beside another job's
    device work."""
    dev = os.environ.get("ASSAY_GPU")
    if not _held or dev is None or _device_held or os.environ.get("SLURM_JOB_ID"):
        return None
    return lock_dir() / f"gpu-{dev}.lock"


def hold_device_lock(path: str | Path, timeout_s: float = 24 * 3600,
                     poll_s: float = 0.2) -> float:
    """In a child given :func:`device_lock`'s path: take it until this process ends; returns the
    seconds waited."""
    fd, waited = _wait_flock(Path(path), f"GPU {os.environ.get('ASSAY_GPU', '')}".strip(),
                             timeout_s, poll_s)
    _device_held.append(fd)
    return waited


def hold_device(timeout_s: float = 24 * 3600, poll_s: float = 0.2) -> float | None:
    """Take the leased GPU alone until this process ends (waiting for the job on it to end);
    returns the seconds waited, or None where there is nothing to take (no lease, SLURM's own
    devices, or taken already). Called before a step's first use of the device: allocations,
    a CUDA context, a child process that computes on it."""
    path = device_lock()
    return None if path is None else hold_device_lock(path, timeout_s, poll_s)


def lock_busy(path: str | Path) -> bool:
    """Whether another process holds the flock on ``path`` now (taken and dropped at once when
    free: a process waiting for it gets it at its next try)."""
    fd = try_flock(Path(path), 0o666)
    if fd is None:
        return True
    _unlock(fd)
    return False


def release_device() -> None:
    """Give the GPU taken by :func:`hold_device` back before this process ends (its place on
    the GPU stays); a no-op when not held. The caller has freed its device memory: only its
    CUDA context is left, which a plan made meanwhile sees as taken (it errs on the safe side)."""
    _unlock_all(_device_held)


def _unlock(fd: int) -> None:
    """Drop the flock held on ``fd`` and close it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _unlock_all(fds: list[int]) -> None:
    """:func:`_unlock` each of ``fds`` (emptied)."""
    while fds:
        _unlock(fds.pop())


def acquire_cpu(timeout_s: float = 24 * 3600, poll_s: float = 0.05) -> float:
    """Take the machine's CPU-timing lease (an flock, dropped by :func:`release_cpu` or when the
    process dies), waiting for the step that holds it; returns the seconds waited. A step holds
    it around its timed part only (``assay.app.cpu_timing``): another step's start-up,
    compile and teardown run beside it, as translation does; the short poll hands it on
    within 50 ms of its release.

    On the cpu target a timing step (device peaks, baselines, verification, profiling) measures
    on the same cores the others would use: two at once on 2 cores made one kernel's speedup
    0.97x in one run and 0.41x in the next. This lease keeps their timed parts apart whatever
    the command line says, and across campaigns run side by side on one machine; Snakemake's
    ``cpu_timing`` resource bounds how many timing steps are started at once (two under the
    default profile: one timing, one getting ready). Under SLURM the job's own CPUs are its
    lease, as for GPUs.
    """
    if _cpu_held or os.environ.get("SLURM_JOB_ID"):
        return 0.0
    fd, waited = _wait_flock(lock_dir() / "cpu.lock", "the CPU lease", timeout_s, poll_s)
    _cpu_held.append(fd)
    return waited


def cpu_held() -> bool:
    """Whether this process holds the CPU lease."""
    return bool(_cpu_held)


def release_cpu() -> None:
    """Give the CPU lease back (a no-op when this process does not hold it)."""
    _unlock_all(_cpu_held)


def hold_cpu_threads(threads: int) -> int:
    """Make this timing step, and every process it starts (the verifier's sandboxed worker, the
    baseline's child; the candidate's own OpenMP), compute on ``threads`` threads; 0 leaves
    the libraries' defaults (one per core). Returns the count now in force.

    Eager, torch.compile and candidates are then timed with the same number of threads, and
    never with more than the step holds: an OpenMP team larger than the free cores waits at
    each barrier for a thread the kernel has descheduled. Measured on the 2-core machine with a
    third process busy: torch.relu over 1M floats took 0.23 ms on one thread every time, and 0.24
    to 19 ms on two. TorchInductor compiles on as many (its compile workers): the baseline step
    compiles outside its CPU lease, on the core it holds, beside another step's timing.
    """
    if threads <= 0:
        return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS"):
        os.environ[var] = str(threads)  # read by the child processes' runtimes at start-up
    torch = sys.modules.get("torch")
    if torch is not None:  # already imported here: its pools read the variables at start-up
        torch.set_num_threads(threads)
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.compile_threads = threads
    return threads


class DeviceTurns:
    """Verifications sharing one GPU (the self-check's tasks in flight) take turns for their
    timed parts: a worker run holds the device alone (:meth:`alone`), while preparations,
    comparisons and analyses run side by side (:meth:`shared`). On an H200 self-check at three
    tasks in flight, one task's float64 references ran while another's candidate was timed:
    the GPU time-slices between processes, so the timed task's device-wide sync ended up to
    2.4 ms after its own stream, and three honest references were called ``stream_ordered``
    failures.

    Two flocks per device (the kernel drops them when a process dies): ``work``, shared by the
    side-by-side parts and taken exclusively by a timed one; ``turn``, a turnstile that a timed
    part holds while it waits, so parts started after it wait too and it is not starved. A
    picklable value (two paths): made once, passed to the processes that share the device."""

    def __init__(self, device: str):
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").replace(",", "_") or "all"
        name = f"turns-{visible}-{device.replace(':', '')}"
        self.turn = str(lock_dir() / f"{name}.turn.lock")
        self.work = str(lock_dir() / f"{name}.work.lock")

    @staticmethod
    def _take(path: str, mode: int) -> int:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        fcntl.flock(fd, mode)
        return fd

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        _unlock(self._take(self.turn, fcntl.LOCK_SH))  # waits while a timed part waits
        fd = self._take(self.work, fcntl.LOCK_SH)
        try:
            yield
        finally:
            _unlock(fd)

    @contextlib.contextmanager
    def alone(self) -> Iterator[None]:
        turn = self._take(self.turn, fcntl.LOCK_EX)
        try:
            fd = self._take(self.work, fcntl.LOCK_EX)
            try:
                yield
            finally:
                _unlock(fd)
        finally:
            _unlock(turn)


def turns_shared(turns: DeviceTurns | None):
    """``turns.shared()``, or nothing to wait for without turns."""
    return turns.shared() if turns is not None else contextlib.nullcontext()


def turns_alone(turns: DeviceTurns | None):
    """``turns.alone()``, or nothing to wait for without turns."""
    return turns.alone() if turns is not None else contextlib.nullcontext()
