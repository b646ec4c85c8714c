"""Faults: SIGTERM / SIGINT stop a step cleanly, a full disk fails it with a clear message, and
a GPU lease outlives no SIGKILL."""

from __future__ import annotations

import errno
import os
import queue
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest

from assay import layout
from helpers import REPO

ROOT = os.geteuid() == 0


def python(code: str, env: dict | None = None, **kw) -> subprocess.Popen:
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def wait_for_line(proc: subprocess.Popen, want: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if want in line:
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"no {want!r} from the child: {proc.stderr.read()[-2000:]}")


# --- signals --------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_a_write_leaves_no_file_at_all(tmp_path, sig):
    target = tmp_path / "out" / "verdict.json"
    proc = python(f"""
        import os, time
        from pathlib import Path
        from assay import layout
        real = os.fsync
        def slow(fd):
            print("writing", flush=True)
            time.sleep(60)
            real(fd)
        os.fsync = slow
        layout.write_json(Path({str(target)!r}), {{"accepted": True}})
        print("finished", flush=True)
    """)
    wait_for_line(proc, "writing")
    proc.send_signal(sig)
    proc.wait(timeout=30)
    assert proc.returncode != 0
    assert list(target.parent.iterdir()) == [], "a partial or temporary file was left"


def test_sigterm_to_a_verifying_step_kills_the_worker_and_removes_its_scratch(tmp_path):
    """A step stopped while a candidate runs: nothing of the candidate survives, its scratch
    folder is removed, no verdict is written."""
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    name = "sig" + os.urandom(4).hex()
    task = tmp_path / "level1" / "1_Relu.py"
    task.parent.mkdir()
    task.write_text(textwrap.dedent("""
        import torch
        from torch import nn
        class Model(nn.Module):
            def forward(self, x):
                return torch.relu(x)
        def get_inputs():
            return [torch.randn(4, 8)]
        def get_init_inputs():
            return []
    """))
    cand = tmp_path / "cand.py"
    cand.write_text(f"import ctypes, time\nctypes.CDLL(None).prctl(15, b'{name}', 0, 0, 0)\n"
                    f"print('candidate running', flush=True)\ntime.sleep(10**6)\n"
                    f"class ModelNew: ...\n")
    verdict = tmp_path / "verdicts" / "c.json"
    proc = python(f"""
        from pathlib import Path
        from assay.layout import write_json
        from assay.tasks.model import Task
        from assay.verify.harness import verify
        from assay.verify.settings import VerifyConfig
        task = Task.from_file({str(task)!r})
        print("verifying", flush=True)
        v = verify(task, Path({str(cand)!r}), "cpu", VerifyConfig(timeout_s=300))
        write_json(Path({str(verdict)!r}), v.to_dict())
    """, env={"TMPDIR": str(scratch_root)})
    wait_for_line(proc, "verifying")
    deadline = time.monotonic() + 120
    while not running(name) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert running(name), "the candidate never started"
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    time.sleep(0.5)
    assert not running(name), "the candidate outlived its step"
    assert not verdict.exists()
    assert [p.name for p in scratch_root.iterdir()
            if p.name.startswith("assay-verify-")] == [], "scratch folder left behind"


def running(name: str) -> bool:
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if Path(f"/proc/{d}/comm").read_text().strip() == name:
                    stat = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
                    if stat[0] not in ("Z", "X"):
                        return True
            except OSError:
                pass
    return False


# --- a full disk ------------------------------------------------------------------------------


def test_write_atomic_says_disk_full_and_names_the_path(tmp_path, monkeypatch):
    target = tmp_path / "results" / "c" / "tasks" / "L1_1.json"

    def no_space(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(layout.os, "fsync", no_space)
    with pytest.raises(layout.DiskFullError) as e:
        layout.write_json(target, {"x": 1})
    msg = str(e.value)
    assert "disk full" in msg and str(target) in msg and "\n" not in msg
    assert isinstance(e.value, OSError) and e.value.errno == errno.ENOSPC
    assert list(target.parent.iterdir()) == []


@pytest.fixture
def tiny_disk():
    """A 1 MB tmpfs, filled up, where root may mount one; else the test is skipped."""
    mnt = Path(tempfile.mkdtemp(prefix="assay-full-"))
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        mnt.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        (mnt / "results" / "full" / "tasks").mkdir(parents=True)
        with open(mnt / "filler", "wb") as f:
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        mnt.rmdir()


def test_a_step_on_a_full_disk_fails_with_a_clear_message(tiny_disk):
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    r = subprocess.run([sys.executable, "-m", "assay.steps.extract", "campaign=full", "tasks=ci",
                        "task=L1_1_ReLU", f"results_dir={tiny_disk / 'results'}",
                        "target=cpu"], capture_output=True, text=True, env=env, cwd=REPO,
                       timeout=300)
    out = r.stdout + r.stderr
    record = tiny_disk / "results" / "full" / "tasks" / "L1_1_ReLU.json"
    assert r.returncode != 0, out[-3000:]
    assert f"disk full: cannot write {record}" in out, out[-3000:]
    assert list(record.parent.iterdir()) == []


# --- GPU lease --------------------------------------------------------------------------------

# A GPU step: a place on a GPU, then (its first use of the device) the device alone.
LEASE = """
    import sys, time
    from assay import gpu
    dev = gpu.acquire(timeout_s=float(sys.argv[1]) if len(sys.argv) > 1 else 30, poll_s=0.1)
    gpu.hold_device(timeout_s=float(sys.argv[1]) if len(sys.argv) > 1 else 30, poll_s=0.1)
    import os
    print("lease", dev, os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
    time.sleep(600)
"""

# A GPU step that prints when it was placed and when it had the device, and holds it HOLD s.
TURN = """
    import os, time
    from assay import gpu
    dev = gpu.acquire(timeout_s=30, poll_s=0.05)
    print("placed", dev, time.time(), flush=True)
    gpu.hold_device(timeout_s=30, poll_s=0.05)
    print("device", dev, time.time(), flush=True)
    time.sleep(float(os.environ["HOLD"]))
"""


def test_jobs_placed_on_one_gpu_get_ready_together_and_use_it_in_turn(tmp_path):
    """Three GPU jobs on two GPUs: each GPU's first place goes before any second one, and the
    job placed second on a GPU starts (is placed) at once but uses the device only after the
    first job on it has ended."""
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "ASSAY_GPU_LOCK_DIR": str(tmp_path / "locks")}
    a = python(TURN, {**env, "HOLD": "12"})
    a_dev = wait_for_line(a, "device").split()
    b = python(TURN, {**env, "HOLD": "12"})
    b_dev = wait_for_line(b, "device").split()
    c = python(TURN, {**env, "HOLD": "0"})
    try:
        c_placed, c_dev = wait_for_line(c, "placed").split(), wait_for_line(c, "device").split()
        assert a_dev[1] == "0" and b_dev[1] == "1" and c_placed[1] == "0", (a_dev, b_dev, c_placed)
        assert float(c_placed[2]) < float(a_dev[2]) + 11  # ready while A had the GPU
        assert float(c_dev[2]) >= float(a_dev[2]) + 11.9  # the device only once A had ended
        assert float(b_dev[2]) < float(a_dev[2]) + 11  # the other GPU: no wait
    finally:
        for p in (a, b, c):
            p.kill()
            p.wait()


def test_gpu_lease_is_released_by_sigkill(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "0,1", "ASSAY_GPU_LOCK_DIR": str(tmp_path / "locks")}
    first = python(LEASE, env, start_new_session=True)
    second = python(LEASE, env, start_new_session=True)
    try:
        got = {wait_for_line(first, "lease").split()[1]: first,
               wait_for_line(second, "lease").split()[1]: second}
        assert sorted(got) == ["0", "1"], "two jobs shared a GPU"
        victim = got["0"]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)
        third = python(LEASE, env, start_new_session=True)
        try:
            line = wait_for_line(third, "lease", timeout=60)
            assert line.split()[1:] == ["0", "0"], line  # the killed job's GPU, alone
        finally:
            third.kill()
            third.wait()
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def test_a_late_gpu_step_takes_the_device_where_it_says_so(tmp_path):
    """``app.step(gpu=True)`` takes the device at the start; ``gpu="late"`` only at
    ``app.on_device`` (and the cpu target never); ``app.off_device`` gives it back early."""
    proc = python("""
        from assay import app, gpu
        cfg = app.compose(["target=cuda"])
        assert gpu.device_lock() is None  # no place on a GPU yet
        app.claim_at_start(cfg, "late", False)
        late = (gpu._held != [], gpu._device_held != [])
        assert gpu.device_lock().name == "gpu-0.lock"  # what a child would take for it
        app.on_device(cfg)
        assert gpu.device_lock() is None  # taken
        app.on_device(cfg)  # (taken once)
        held = len(gpu._device_held)
        from assay.layout import try_flock
        lock = gpu.lock_dir() / "gpu-0.lock"
        busy = try_flock(lock) is None  # (another descriptor: as another process would)
        app.off_device()  # given back before the process ends
        print("late", late, held, busy, try_flock(lock) is not None, flush=True)
    """, {"CUDA_VISIBLE_DEVICES": "0", "ASSAY_GPU_LOCK_DIR": str(tmp_path)})
    out, err = proc.communicate(timeout=120)
    assert "late (True, False) 1 True True" in out, err[-2000:]
    proc = python("""
        from assay import app, gpu
        app.claim_at_start(app.compose(["target=cuda"]), True, False)
        held = len(gpu._device_held)
        app.on_device(app.compose(["target=cpu"]))
        print("start", held, len(gpu._device_held), flush=True)
    """, {"CUDA_VISIBLE_DEVICES": "0", "ASSAY_GPU_LOCK_DIR": str(tmp_path)})
    out, err = proc.communicate(timeout=120)
    assert "start 1 1" in out, err[-2000:]


def test_extract_takes_the_gpu_in_its_child(tmp_path):
    """The task record's child takes the device lock it is given (assay.gpu.device_lock)
    before its first use of the device: while another job holds it, the record waits."""
    import threading

    from assay.layout import try_flock
    from assay.tasks.record import analyze_file

    lock = tmp_path / "gpu-0.lock"
    fd = try_flock(lock)
    got: dict = {}

    def extract():
        got["record"] = analyze_file(REPO / "data/tasks/level1/1_ReLU.py", 1, "small", "cpu",
                                     timeout_s=120, device_lock=lock)

    thread = threading.Thread(target=extract)
    try:
        thread.start()
        time.sleep(8)  # (the record alone takes about 4 s here)
        assert thread.is_alive(), got  # waiting for the device
    finally:
        os.close(fd)  # the other job ends
    thread.join(120)
    assert got["record"]["error"] is None, got


@pytest.mark.parametrize("busy", [True, False])
def test_the_time_a_task_waits_for_the_gpu_is_not_task_time(tmp_path, busy):
    """A child whose stage file says it waits for the GPU gets the time while another process
    holds the lock, and none when nobody does (the words alone buy no time)."""
    from assay.layout import try_flock
    from assay.tasks.record import WAITING, _wait

    lock, stage = tmp_path / "gpu-0.lock", tmp_path / "stage"
    stage.write_text(WAITING)
    fd = try_flock(lock) if busy else None
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(4)"])
    try:
        assert _wait(child, stage, 1.5, lock, poll_s=0.1) == (0 if busy else None)
    finally:
        child.kill()
        child.wait()
        if fd is not None:
            os.close(fd)


@pytest.mark.parametrize("answer,arch", [("9.0", "sm_90"), ("12.0", "sm_120"), ("", None)])
def test_the_build_arch_is_asked_of_the_driver(tmp_path, monkeypatch, answer, arch):
    """A GPU step pins the kernels' arch before it takes the device: from nvidia-smi (a
    stand-in here: sm_120 on a machine without a GPU can only come from it), not from torch,
    which would start CUDA in the step's process; no answer, no GPU here: none."""
    from assay.verify.compile_service import pin_cuda_arch

    smi = tmp_path / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\necho "$*" > {tmp_path}/args\nprintf "{answer}\\n"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setenv("ASSAY_CUDA_ARCH", "")
    pin_cuda_arch()
    assert (os.environ["ASSAY_CUDA_ARCH"] or None) == arch
    assert (tmp_path / "args").read_text().split() == [
        "--query-gpu=compute_cap", "--format=csv,noheader", "-i", "3"]


def test_a_gpu_that_never_comes_free_names_who_holds_it(tmp_path):
    from assay.layout import try_flock

    lock = tmp_path / "gpu-0.lock"
    fd = try_flock(lock)
    try:
        proc = python(f"""
            from pathlib import Path
            from assay import gpu
            try:
                gpu._wait_flock(Path({str(lock)!r}), "GPU 0", 0.3, 0.05)
            except TimeoutError as e:
                print("timeout:", e, flush=True)
        """)
        out, err = proc.communicate(timeout=60)
    finally:
        os.close(fd)
    assert f"GPU 0 ({lock}) did not come free in 0 s (held by pid {os.getpid()})" in out, \
        out + err[-2000:]


def test_a_second_acquire_in_the_same_process_keeps_its_lease(tmp_path):
    proc = python("""
        from assay import gpu
        a = gpu.acquire(timeout_s=5, poll_s=0.1)
        b = gpu.acquire(timeout_s=5, poll_s=0.1)
        print("lease", a, b, flush=True)
    """, {"CUDA_VISIBLE_DEVICES": "3", "ASSAY_GPU_LOCK_DIR": str(tmp_path)})
    out, err = proc.communicate(timeout=60)
    assert "lease 3 3" in out, err[-2000:]


CPU_LEASE = """
    import time
    from assay import gpu
    waited = gpu.acquire_cpu(timeout_s=60, poll_s=0.05)
    print("cpu lease", flush=True)
    time.sleep(600)
"""


def test_cpu_lease_lets_one_timing_step_at_a_time_and_outlives_no_sigkill(tmp_path):
    """Two timing steps on the cpu target: the second waits until the first is gone (killed)."""
    env = {"ASSAY_GPU_LOCK_DIR": str(tmp_path / "locks")}
    first = python(CPU_LEASE, env, start_new_session=True)
    second = None
    try:
        wait_for_line(first, "cpu lease")
        second = python(CPU_LEASE, env, start_new_session=True)
        ready, _, _ = select.select([second.stdout], [], [], 5)
        assert not ready and second.poll() is None, "two timing steps held the CPU at once"
        os.kill(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
        wait_for_line(second, "cpu lease", timeout=30)
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait()


TIMED_PART = """
    import sys, time
    from omegaconf import OmegaConf
    from assay import app
    cfg = OmegaConf.create({"target": {"name": "cpu", "cpu_threads": 1}})
    print("ready", flush=True)
    with app.cpu_timing(cfg):
        print("timing", flush=True)
        sys.stdin.readline()  # times until the test says
    print("teardown", flush=True)
    time.sleep(600)
"""


def test_a_timing_step_holds_the_cpu_lease_for_its_timed_part_only(tmp_path):
    """A step gives the CPU lease back when its timed part ends: the next step times while the
    first is still tearing down (its start-up and teardown need not be serialized), and not
    before."""
    env = {"ASSAY_GPU_LOCK_DIR": str(tmp_path / "locks")}
    steps: list[subprocess.Popen] = []
    said: list[queue.Queue] = []

    def start() -> None:  # a step whose lines are read as they come (no buffer in between)
        steps.append(python(TIMED_PART, env, start_new_session=True, stdin=subprocess.PIPE))
        said.append(queue.Queue())
        threading.Thread(target=lambda p=steps[-1], q=said[-1]: [
            q.put(line.strip()) for line in p.stdout], daemon=True).start()

    try:
        start()
        assert [said[0].get(timeout=60) for _ in range(2)] == ["ready", "timing"]
        start()
        assert said[1].get(timeout=60) == "ready"
        with pytest.raises(queue.Empty):  # waits for the lease, however long the first times
            said[1].get(timeout=2)
        steps[0].stdin.write("done\n")
        steps[0].stdin.flush()
        assert said[0].get(timeout=30) == "teardown" and said[1].get(timeout=30) == "timing"
        assert steps[0].poll() is None  # the first step still runs: its lease was given back
    finally:
        for p in steps:
            p.kill()
            p.wait()


def test_slurm_jobs_on_one_node_do_not_wait_for_each_other(tmp_path):
    """Under SLURM every job's devices are numbered from 0: the scheduler's allocation is the
    lease, so two jobs that both see "0" both start at once (no shared lock by index)."""
    env = {"CUDA_VISIBLE_DEVICES": "0", "ASSAY_GPU_LOCK_DIR": str(tmp_path / "locks")}
    first = python(LEASE, {**env, "SLURM_JOB_ID": "101"}, start_new_session=True)
    second = python(LEASE, {**env, "SLURM_JOB_ID": "102"}, start_new_session=True)
    try:
        for p in (first, second):
            assert wait_for_line(p, "lease", timeout=60).split()[1:] == ["0", "0"]
        # Without SLURM the same two jobs share one lock: the second one waits.
        third = python(LEASE.replace("else 30", "else 1"), env, start_new_session=True)
        fourth = python(LEASE.replace("else 30", "else 1"), env, start_new_session=True)
        try:
            outs = []
            for p in (third, fourth):
                try:
                    outs.append(wait_for_line(p, "lease", timeout=20))
                except Exception as e:  # noqa: BLE001 - the one that timed out on the lock
                    outs.append(type(e).__name__)
            assert sum(o.startswith("lease") for o in outs) == 1, outs
        finally:
            for p in (third, fourth):
                p.kill()
                p.wait()
    finally:
        for p in (first, second):
            p.kill()
            p.wait()


def test_device_turns_give_a_timed_part_the_device_alone_and_do_not_starve_it(tmp_path,
                                                                              monkeypatch):
    """Self-check tasks sharing a GPU: a worker run waits for the preparations in flight, runs
    alone, and preparations started while it waits wait for it (flocks: separate descriptors
    conflict within one process too, so threads stand in for the processes)."""
    import threading

    from assay.gpu import DeviceTurns

    monkeypatch.setenv("ASSAY_GPU_LOCK_DIR", str(tmp_path))
    turns = DeviceTurns("cuda:0")
    log: list[str] = []
    release_a = threading.Event()

    def prepare_a():
        with turns.shared():
            log.append("A in")
            release_a.wait(10)
            log.append("A out")

    def timed():
        with turns.alone():
            log.append("W in")
            time.sleep(0.2)
            log.append("W out")

    def prepare_b():
        with turns.shared():
            log.append("B in")

    a = threading.Thread(target=prepare_a)
    a.start()
    while "A in" not in log:
        time.sleep(0.01)
    w = threading.Thread(target=timed)
    w.start()
    time.sleep(0.2)  # W now waits for A, holding the turnstile
    b = threading.Thread(target=prepare_b)
    b.start()
    time.sleep(0.2)
    assert log == ["A in"]  # neither the timed part nor a later preparation got in
    release_a.set()
    for t in (a, w, b):
        t.join(10)
    assert log == ["A in", "A out", "W in", "W out", "B in"]
