"""The step server (assay.stepserver): `python -m assay.steps RULE` forks the step from a process
that imported torch already, and the step behaves as in a process of its own: exit status,
streams, folder, environment; signals reach it, a client killed without a word takes it along;
only this user's processes in this process's namespaces get a step.

Each test has a socket folder of its own (XDG_RUNTIME_DIR, short: a socket path has 107 bytes at
most) and servers that leave after 5 idle seconds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from helpers import REPO, env

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

# tests/bad_tasks' task that sleeps at import, saying first where it runs
SLEEPY = (REPO / "tests" / "bad_tasks" / "level1" / "15_Sleeps_At_Import.py").read_text().replace(
    "time.sleep(10**6)",
    "import os\n"
    "with open(os.environ['PID_FILE'] + '.tmp', 'w') as f:\n"
    "    f.write(str(os.getpid()))\n"
    "os.replace(os.environ['PID_FILE'] + '.tmp', os.environ['PID_FILE'])\n"
    "time.sleep(10**6)")


@pytest.fixture
def runtime():
    d = Path(tempfile.mkdtemp(prefix="as", dir="/tmp"))
    d.chmod(0o700)
    yield d
    for sock in (d / "assay-steps").glob("*.sock"):  # servers still up end with their socket
        pid = _server_pid(sock)
        if pid:
            os.kill(pid, signal.SIGKILL)
    shutil.rmtree(d, ignore_errors=True)


def _server_pid(sock: Path) -> int | None:
    lock = sock.with_suffix(".lock")
    try:
        return int(lock.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def step_env(runtime: Path, **extra: str) -> dict[str, str]:
    return env(**{"XDG_RUNTIME_DIR": str(runtime), "ASSAY_STEP_SERVER_IDLE": "5", **extra})


def extract(tmp_path: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "assay.steps", "extract", "campaign=s", "tasks=ci",
            "task=L1_1_ReLU", f"results_dir={tmp_path / 'results'}", "target=cpu", *overrides]


def sockets(runtime: Path) -> list[Path]:
    return sorted((runtime / "assay-steps").glob("*.sock"))


def test_a_step_on_the_server_is_the_step_in_its_own_process(tmp_path, runtime):
    """The same exit status and one-line error as `python -m assay.steps.extract`, the record
    written where the step's folder and overrides say; the second run uses the same server."""
    bad = ["verify.policy=lenient"]
    alone = subprocess.run([sys.executable, "-m", "assay.steps.extract", *extract(tmp_path)[5:],
                            *bad], capture_output=True, text=True, env=step_env(runtime),
                           cwd=tmp_path, timeout=300)
    served = subprocess.run(extract(tmp_path, *bad), capture_output=True, text=True,
                            env=step_env(runtime), cwd=tmp_path, timeout=300)
    assert alone.returncode == served.returncode == 2, served.stderr[-3000:]
    assert served.stderr == alone.stderr and served.stdout == alone.stdout
    assert len(sockets(runtime)) == 1, "no server was started"
    server = _server_pid(sockets(runtime)[0])

    with open(tmp_path / "log", "w") as log:  # the rule's `> {log} 2>&1`
        r = subprocess.run(extract(tmp_path), stdout=log, stderr=subprocess.STDOUT,
                           env=step_env(runtime), cwd=tmp_path, timeout=300)
    text = (tmp_path / "log").read_text()
    assert r.returncode == 0, text[-3000:]
    assert "runs in this process" not in text, text
    record = tmp_path / "results" / "s" / "tasks" / "L1_1_ReLU.json"
    assert record.exists(), text
    assert [_server_pid(s) for s in sockets(runtime)] == [server]


def test_a_server_per_environment_and_gone_when_idle(tmp_path, runtime):
    """A variable a module may read at import keys the server; an idle one removes its files.

    The servers' sockets are read after each run: starting the second server (torch's imports)
    took longer than the first one's 5 idle seconds on CI's loaded machine."""
    bad = ["verify.policy=lenient"]
    seen = set()
    for value in ("1", "2"):
        r = subprocess.run(extract(tmp_path, *bad), capture_output=True, text=True,
                           env=step_env(runtime, OMP_NUM_THREADS=value,
                                        ASSAY_STEP_SERVER_IDLE="10"),
                           cwd=tmp_path, timeout=300)
        assert r.returncode == 2, r.stderr[-3000:]
        seen.update(s.name for s in sockets(runtime))
    assert len(seen) == 2, seen
    deadline = time.monotonic() + 90
    while any((runtime / "assay-steps").iterdir()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any((runtime / "assay-steps").iterdir()), "an idle server stayed"


def test_off_runs_the_step_in_the_client(tmp_path, runtime):
    for extra in ({"ASSAY_STEP_SERVER": "0"}, {"SLURM_JOB_ID": "7"}):
        r = subprocess.run(extract(tmp_path, "verify.policy=lenient"), capture_output=True,
                           text=True, env=step_env(runtime, **extra), cwd=tmp_path, timeout=300)
        assert r.returncode == 2, r.stderr[-3000:]
        assert not (runtime / "assay-steps").exists() or not sockets(runtime)


def test_a_rule_that_is_no_step_is_a_usage_error(tmp_path, runtime):
    r = subprocess.run([sys.executable, "-m", "assay.steps", "nope"], capture_output=True,
                       text=True, env=step_env(runtime), cwd=tmp_path, timeout=60)
    assert r.returncode == 2 and "RULE is one of device, extract" in r.stderr, r.stderr


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float = 120) -> int:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "the task never ran"
        time.sleep(0.1)
    return int(path.read_text())


def _gone(pid: int, timeout_s: float = 20) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[-1].startswith("Z"):
                    return True  # ended, not reaped yet
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_to_the_client_ends_the_step_and_what_it_started(tmp_path, runtime, sig):
    """SIGTERM (Snakemake stopping a job) goes to the step, which stops its task's analysis;
    SIGKILL ends the client at once: the server kills the step, the analysis dies with it."""
    src = tmp_path / "tasks" / "level1"
    src.mkdir(parents=True)
    (src / "1_Sleepy.py").write_text(SLEEPY)
    pid_file = tmp_path / "task.pid"
    cmd = [sys.executable, "-m", "assay.steps", "extract", "campaign=s", "tasks=kernelbench",
           f"tasks.source={tmp_path / 'tasks'}", "task=L1_1_Sleepy",
           f"results_dir={tmp_path / 'results'}", "target=cpu"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=step_env(runtime, PID_FILE=str(pid_file)), cwd=tmp_path,
                            start_new_session=True)
    try:
        task = _wait_for(pid_file, proc)
        cmdline = Path(f"/proc/{task}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        assert "assay.stepserver" in cmdline, cmdline  # forked: the step's, the server's image
        proc.send_signal(sig)
        proc.wait(timeout=60)
        assert _gone(task), f"the task's analysis {task} outlived its step"
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGTERM:  # the step's own exit: what SIGTERM makes of it
        out = proc.stdout.read()
        assert proc.returncode != 0, out
        assert "Traceback" not in out, out


def _peer_script(path: Path) -> str:
    """Asks the server at ``path`` (not one of its own) for a step: refused, or answered."""
    return textwrap.dedent(f"""
        import json, os, socket, sys
        path = {str(path)!r}
        try:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            sock.connect(path)
            req = {{"rule": "extract", "args": ["verify.policy=lenient"],
                    "env": dict(os.environ), "cwd": os.getcwd(), "umask": 0o22}}
            socket.send_fds(sock, [json.dumps(req).encode()], [0, 1, 2])
            answer = sock.recv(1 << 20)
        except OSError as e:
            print("refused:", e)
            sys.exit(0)
        if not answer:
            print("refused: the server closed the connection")
            sys.exit(0)
        print("answered:", answer)
        sys.exit(1)
    """)


def test_a_peer_of_another_uid_or_namespace_gets_no_step(tmp_path, runtime):
    """What a sandboxed candidate is: another uid (it cannot reach the socket's folder) or
    namespaces of its own (the server closes the connection)."""
    r = subprocess.run(extract(tmp_path, "verify.policy=lenient"), capture_output=True,
                       text=True, env=step_env(runtime), cwd=tmp_path, timeout=300)
    assert r.returncode == 2 and len(sockets(runtime)) == 1, r.stderr[-3000:]
    tried, unshared = 0, False
    if os.geteuid() == 0 and shutil.which("setpriv"):
        runtime.chmod(0o755)  # (the socket folder itself stays 0700)
        r = subprocess.run(["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups",
                            sys.executable, "-c", _peer_script(sockets(runtime)[0])],
                           capture_output=True, text=True, env=step_env(runtime), cwd="/",
                           timeout=120)
        assert r.returncode == 0 and "refused:" in r.stdout, r.stdout + r.stderr
        tried += 1
    if shutil.which("unshare"):
        r = subprocess.run(["unshare", "--mount", "--net", sys.executable, "-c",
                            _peer_script(sockets(runtime)[0])], capture_output=True, text=True,
                           env=step_env(runtime), cwd=tmp_path, timeout=120)
        if "Operation not permitted" not in r.stderr:
            assert r.returncode == 0 and "refused:" in r.stdout, r.stdout + r.stderr
            tried, unshared = tried + 1, True
    if not tried:
        pytest.skip("neither another uid nor new namespaces can be had here")
    if unshared:  # it reached the socket, and the server said no
        log = sockets(runtime)[0].with_suffix(".log").read_text()
        assert "refused a connection: pid" in log and "other namespaces" in log, log


def test_a_client_gone_before_it_was_accepted_is_no_refusal(tmp_path):
    """A client killed while the server imported (a campaign killed at its start) left its
    connection in the backlog: closed without a word, not logged as a refusal."""
    import socket

    from assay.stepserver import GONE, _namespaces, _refuse

    path = str(tmp_path / "s.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(4)
    code = (f"import socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
            f"s.connect({path!r}); s.send(b'x')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)  # connects, then ends
    conn, _ = listener.accept()
    assert _refuse(conn, _namespaces(os.getpid())) == GONE
    mine = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine.connect(path)
    conn, _ = listener.accept()
    assert _refuse(conn, _namespaces(os.getpid())) is None  # this process: same uid, namespaces


@pytest.mark.gpu
def test_the_server_leaves_cuda_to_its_steps(tmp_path, runtime):
    """On a GPU machine: the device step, forked twice from one server, probes the GPU (CUDA
    initialized in each step); the server itself never initializes CUDA (a fork after cuInit is
    unusable): nvidia-smi lists no context of it and it has no GPU device file open or mapped.
    The driver's library may be loaded (an import dlopens it on torch 2.11+cu130, H100): loading
    is not initializing, and the steps forked after it ran CUDA."""
    cmd = [sys.executable, "-m", "assay.steps", "device", "campaign=s", "tasks=ci",
           f"results_dir={tmp_path / 'results'}", "target=cuda"]
    for _ in range(2):
        r = subprocess.run(cmd, capture_output=True, text=True, env=step_env(runtime),
                           cwd=tmp_path, timeout=600)
        assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
        assert "runs in this process" not in r.stderr, r.stderr
    import json

    device = json.loads((tmp_path / "results" / "s" / "device.json").read_text())
    assert not device["name"].startswith("cpu") and device["flops_tflops"] > 1, device
    server = _server_pid(sockets(runtime)[0])
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60).stdout.split()
    assert str(server) not in apps, apps
    # cuInit opens /dev/nvidiactl and the GPUs' device files; a context maps them
    opened = []
    for fd in Path(f"/proc/{server}/fd").iterdir():
        with contextlib.suppress(OSError):  # (an fd closed meanwhile)
            opened += [t for t in [os.readlink(fd)] if t.startswith("/dev/nvidia")]
    assert not opened, f"the server initialized CUDA: {opened}"
    mapped = [line for line in Path(f"/proc/{server}/maps").read_text().splitlines()
              if "/dev/nvidia" in line]
    assert not mapped, f"the server holds CUDA mappings: {mapped[:3]}"
