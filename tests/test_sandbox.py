"""The sandbox: hostile candidates are rejected with the reason, in time, and nothing escapes.

Through the verifier (``verify``) for the acceptance cases of issue #7 (fork bomb, 100 GB, a
socket, writes outside the scratch folder, sleeping forever), and through ``run_sandboxed``
directly for the layers themselves (what is recorded, fallbacks, cgroups, the kernel cache).
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from assay.tasks.model import Task
from assay.verify.harness import prepare, verify
from assay.verify.sandbox import run_sandboxed
from assay.verify.sandbox.parent import LAYERS
from assay.verify.settings import VerifyConfig
from assay.verify.settings import SandboxLimits
from conftest import REPO

ROOT = os.geteuid() == 0

TASK = """
import torch
from torch import nn
class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
def get_inputs():
    return [torch.randn(8, 64)]
def get_init_inputs():
    return []
"""


def marker() -> str:
    return "bx" + uuid.uuid4().hex[:10]  # fits a 15-character process name


def live_named(name: str) -> list[int]:
    """Live processes whose name or command line carries ``name``."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            comm = Path(f"/proc/{d}/comm").read_text().strip()
            cmdline = Path(f"/proc/{d}/cmdline").read_bytes().decode(errors="replace")
            state = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if (name in comm or name in cmdline) and state not in ("Z", "X"):
            found.append(int(d))
    return found


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    path = tmp_path_factory.mktemp("task") / "level1" / "1_Relu.py"
    path.parent.mkdir()
    path.write_text(TASK)
    return Task.from_file(path)


@pytest.fixture(scope="module")
def prepared(task):
    return prepare(task, "cpu", VerifyConfig())


def judge(task, prepared, tmp_path, code: str, **cfg):
    cand = tmp_path / "candidate.py"
    # Named, so the cheap checks (which never run the file) let it reach the sandbox.
    cand.write_text(code + "\nModelNew = None\n")
    limits = SandboxLimits(**cfg.pop("limits", {}))
    vcfg = VerifyConfig(budget_s=0.1, min_runs=5, max_runs=10, limits=limits, **cfg)
    t0 = time.monotonic()
    v = verify(task, cand, "cpu", vcfg, prepared=prepared)
    details = " | ".join(c["detail"] for c in v.checks.values()) + " | " + v.error
    return v, details, time.monotonic() - t0


def test_fork_bomb_is_contained_and_killed(task, prepared, tmp_path):
    name = marker()
    code = f"""
import ctypes, os, time
ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)
while True:
    try:
        os.fork()
    except OSError:
        time.sleep(0.001)
"""
    v, details, took = judge(task, prepared, tmp_path, code, timeout_s=15,
                             limits={"processes": 64})
    assert not v.accepted and v.reasons == ["timeout"], (v.reasons, details)
    assert "timeout after 15 s" in details
    assert took < 15 + 20
    assert live_named(name) == []


def test_100_gb_allocation_is_refused(task, prepared, tmp_path):
    code = "import torch\nx = torch.empty(100 * 2**30, dtype=torch.uint8)\nx.fill_(1)\n"
    v, details, took = judge(task, prepared, tmp_path, code, timeout_s=60)
    assert not v.accepted, details
    assert "can't allocate memory" in details or "MemoryError" in details, details
    assert took < 60


def test_memory_touched_bit_by_bit_hits_the_limit(task, prepared, tmp_path):
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(128 << 20))\n"
    v, details, took = judge(task, prepared, tmp_path, code, timeout_s=60,
                             limits={"memory_gb": 2})
    assert not v.accepted, details
    assert "MemoryError" in details or "out of memory" in details, details


def test_sockets_reach_nothing(task, prepared, tmp_path):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    server.settimeout(0.2)
    accepted = []

    def serve():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not accepted:
            try:
                accepted.append(server.accept())
            except (TimeoutError, OSError):
                continue

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    code = f"""
import socket
found = []
for host, port in [("127.0.0.1", {port}), ("1.1.1.1", 443), ("8.8.8.8", 53)]:
    try:
        socket.create_connection((host, port), timeout=3)
        found.append(f"CONNECTED to {{host}}")
    except OSError as e:
        found.append(f"{{host}}: {{e}}")
try:
    socket.getaddrinfo("example.com", 443)
    found.append("RESOLVED example.com")
except OSError as e:
    found.append(f"dns: {{e}}")
raise ConnectionError("; ".join(found))
"""
    try:
        v, details, _ = judge(task, prepared, tmp_path, code, timeout_s=60)
    finally:
        server.close()
    assert not accepted, "the candidate reached a socket on 127.0.0.1"
    assert not v.accepted
    if ROOT:
        assert "127.0.0.1: [Errno 101] Network is unreachable" in details, details
        assert "CONNECTED" not in details and "RESOLVED" not in details, details


@pytest.mark.skipif(not ROOT, reason="read-only mounts and another uid need root")
def test_writes_outside_scratch_are_refused(task, prepared, tmp_path, tmp_path_factory):
    name = marker()
    results = tmp_path_factory.mktemp("results") / "camp"
    (results / "tasks").mkdir(parents=True)
    record = results / "tasks" / "L1_1_Relu.json"
    record.write_text('{"id": "L1_1_Relu"}\n')
    for d in (results.parent, results, results / "tasks"):
        os.chmod(d, 0o755)  # as a real results tree: readable by all, writable by its owner
    harness = REPO / "src" / "assay" / "verify" / "harness.py"
    before = {p: p.read_bytes() for p in (record, harness)}
    targets = [record, results / "tasks" / f"{name}.json", Path(f"/tmp/{name}"),
               REPO / f"{name}.txt", Path(f"/dev/shm/{name}"), Path(f"/var/tmp/{name}"), harness]
    code = f"""
import os
found = []
for p in {[str(p) for p in targets]!r}:
    try:
        os.close(os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        found.append(f"OPENED {{p}}")
    except OSError as e:
        found.append(f"{{p}}: {{e.strerror}}")
try:
    os.kill({os.getpid()}, 0)
    found.append("COULD SIGNAL the harness")
except OSError as e:
    found.append(f"signal: {{e.strerror}}")
with open("inside_scratch.txt", "w") as f:  # its own scratch folder is writable
    f.write("fine")
found.append("scratch ok")
raise PermissionError("; ".join(found))
"""
    try:
        v, details, _ = judge(task, prepared, tmp_path, code, timeout_s=60)
        assert not v.accepted
        assert "OPENED" not in details and "COULD SIGNAL" not in details, details
        assert "scratch ok" in details, details
        assert details.count("Read-only file system") >= len(targets) - 1, details
        for p in targets[1:-1]:
            assert not p.exists(), p
        for p, data in before.items():
            assert p.read_bytes() == data, p
    finally:
        for p in targets[1:-1]:
            if p.exists():
                p.unlink()


def test_sleeping_forever_times_out_and_leaves_nothing(task, prepared, tmp_path):
    name = marker()
    code = f"""
import ctypes, os, time
if os.fork() == 0:          # a daemon that leaves the session: must die all the same
    os.setsid()
    if os.fork() == 0:
        ctypes.CDLL(None).prctl(15, b"{name}", 0, 0, 0)
        time.sleep(10**6)
    os._exit(0)
time.sleep(10**6)
"""
    v, details, took = judge(task, prepared, tmp_path, code, timeout_s=8)
    assert v.reasons == ["timeout"], details
    assert took < 8 + 20
    time.sleep(0.2)
    assert live_named(name) == []


# --- run_sandboxed directly -------------------------------------------------------------------


def run_script(code: str, device: str = "cpu", timeout_s: float = 30, **limits):
    scratch = Path(tempfile.mkdtemp(prefix="assay-sbx-test-"))
    try:
        (scratch / "s.py").write_text(code)
        out = run_sandboxed([sys.executable, str(scratch / "s.py")], scratch, timeout_s,
                                    SandboxLimits(**limits), device)
        left = sorted(p.name for p in scratch.iterdir())
        log = (scratch / "worker.log").read_text(errors="replace")
        return out, left, log
    finally:
        subprocess.run(["rm", "-rf", str(scratch)], check=False)


def unshare_allowed() -> bool:
    return subprocess.run(["unshare", "-n", "-m", "-p", "-f", "true"],
                          capture_output=True).returncode == 0


def test_outcome_is_the_old_string_with_the_isolation_attached():
    out, _, _ = run_script("print('hello')")
    assert out == "ok" and isinstance(out, str) and out.ok and out.status == "ok"
    assert set(out.isolation) == set(LAYERS)
    assert out.isolation_line().startswith("sandbox ")
    bad, _, log = run_script("import sys\nprint('boom')\nsys.exit(5)")
    assert bad.startswith("exit 5:") and "boom" in bad and bad.status == "exit"
    late, _, _ = run_script("import time\ntime.sleep(60)", timeout_s=2)
    assert late.startswith("timeout after 2 s") and late.status == "timeout"


@pytest.mark.skipif(not ROOT or not unshare_allowed(), reason="namespaces need root here")
def test_every_layer_is_on_as_root_here():
    out, _, log = run_script("""
import os
print("uid", os.getuid(), "pid", os.getpid(), "procs", sorted(os.listdir("/proc"))[:3])
""")
    assert out == "ok", (out, log)
    assert out.missing() == {}, out.isolation
    assert "uid 0" not in log and "pid 1 " in log


def test_the_worker_has_a_user_name_and_private_compiler_caches():
    """The sandbox's uid has no passwd entry: getpass.getuser() (inductor's cache name, read
    at torch.compile) must still answer, and inductor's and Triton's caches are the scratch
    folder's (an H100 run rejected a torch.compile candidate as not compiling: KeyError
    'getpwuid(): uid not found')."""
    out, _, log = run_script("""
import getpass, os
print("user", getpass.getuser())
print("caches", os.environ["TORCHINDUCTOR_CACHE_DIR"].startswith(os.getcwd()),
      os.environ["TRITON_CACHE_DIR"].startswith(os.getcwd()))
""")
    assert out == "ok", (out, log)
    assert "user assay-sandbox" in log and "caches True True" in log


@pytest.mark.skipif(not ROOT, reason="the fallbacks are those of a root harness")
def test_refused_layers_are_recorded_and_the_worker_still_runs(monkeypatch):
    monkeypatch.setenv("ASSAY_SANDBOX_DISABLE", "mount,pidns,net,cgroup,uid")
    out, _, log = run_script("""
import os
caps = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")]
print("uid", os.getuid(), "caps", caps)
""")
    assert out == "ok", (out, log)
    miss = out.missing()
    assert set(miss) >= {"pid_namespace", "network", "filesystem", "user", "processes"}, miss
    assert "root with every capability dropped" in miss["user"]
    assert "caps ['0000000000000000']" in log
    assert "sandbox incomplete" in out.isolation_line()


@pytest.mark.skipif(not ROOT, reason="the launcher's report and scratch clean-up as root")
def test_scratch_is_cleaned_of_links_and_fifos():
    out, left, _ = run_script("""
import os
os.symlink("/etc/shadow", "result.pt")
os.mkfifo("fifo")
open("plain.txt", "w").write("x")
""")
    assert out == "ok"
    assert "result.pt" not in left and "fifo" not in left and "plain.txt" in left


@pytest.mark.skipif(not ROOT, reason="cgroups are made by root")
def test_memory_cgroup_bounds_the_cuda_target_too():
    """On cuda there is no address-space limit (CUDA maps far more than it uses): the memory
    cgroup is what stops a candidate that fills host memory."""
    probe, _, _ = run_script("pass", device="cuda", memory_gb=1)
    if not probe.isolation["memory"].startswith("on"):
        pytest.skip(f"no memory cgroup here: {probe.isolation['memory']}")
    out, _, log = run_script("""
chunks = []
for _ in range(24):                      # stops by itself at 3 GB if nothing stops it
    chunks.append(bytearray(128 << 20))
print("NOT LIMITED")
""", device="cuda", memory_gb=1)
    assert "NOT LIMITED" not in log
    assert out.status == "signal" and "out of memory" in out, out


@pytest.mark.skipif(not ROOT or not unshare_allowed(), reason="needs the uid and mount layers")
def test_kernel_cache_is_shared_but_frozen(tmp_path, monkeypatch):
    cache = tmp_path / "kcache"
    cache.mkdir()
    (cache / "old.so").write_bytes(b"built by someone else")
    os.chmod(cache / "old.so", 0o644)
    monkeypatch.setenv("ASSAY_KERNEL_CACHE", str(cache))
    out, _, log = run_script("""
import os
cache = os.environ["ASSAY_KERNEL_CACHE"]
open(os.path.join(cache, "new.so"), "wb").write(b"mine")
for what, fn in [("overwrite", lambda: open(os.path.join(cache, "old.so"), "wb")),
                 ("unlink", lambda: os.unlink(os.path.join(cache, "old.so"))),
                 ("rename", lambda: os.rename(os.path.join(cache, "new.so"),
                                              os.path.join(cache, "old.so")))]:
    try:
        fn()
        print("DID", what)
    except OSError as e:
        print("refused", what, e.strerror)
""")
    assert out == "ok", (out, log)
    assert "DID" not in log and log.count("refused") == 3, log
    assert (cache / "old.so").read_bytes() == b"built by someone else"
    st = (cache / "new.so").stat()
    assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) & 0o222 == 0, oct(st.st_mode)
