"""The zygote (assay.verify.sandbox.zygote): workers forked from an interpreter that imported
torch already get the sandbox the exec path gives them, and nothing of the zygote's.

Each test drives its own harness in a fresh Python, so the zygote it checks is started with
the environment the test sets (a pytest worker's zygote would be shared by its other tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "tests" / "zoo"

# A candidate that reports what it can reach, then fails: its verdict's error is the report.
SNOOP = '''
import os, stat, sys
import torch


class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        sockets = []
        for fd in sorted(int(f) for f in os.listdir("/proc/self/fd")):
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    sockets.append(fd)
            except OSError:
                pass
        with open("/proc/self/environ", "rb") as f:
            initial = f.read()
        secret = b"ASSAY_TEST_SECRET" in initial or "ASSAY_TEST_SECRET" in os.environ
        forked = "assay.verify.sandbox.zygote" in sys.modules  # the zygote's code is here
        raise RuntimeError(f"FINDINGS sockets={sockets} secret={secret} forked={forked} "
                           f"home={os.environ.get('HOME')}")
'''

# A candidate that only burns CPU: the sandbox's CPU-seconds limit ends it.
SPIN = '''
import torch
class ModelNew(torch.nn.Module):
    def __init__(self, *args):
        super().__init__()
        while True:
            pass
'''

HARNESS = '''
import json, sys
from pathlib import Path
from assay.tasks.model import Task
from assay.verify.harness import VerifyConfig, verify
from assay.verify.sandbox import zygote
task = Task.from_file(Path(sys.argv[1]), size="small")
cfg = VerifyConfig(budget_s=0.05, warmup_s=0.01, min_runs=5)
cfg.limits.cpu_s = int(sys.argv[3])
for _ in range(2):  # the second finds the zygote warm
    times = {}
    v = verify(task, Path(sys.argv[2]), sys.argv[4], cfg, times=times)
    print("VERDICT " + json.dumps({"accepted": v.accepted, "error": v.error,
                                   "reasons": v.reasons, "import_s": times.get("import_s"),
                                   "zygotes": len(zygote.Zygote._all)}), flush=True)
'''


def _harness(tmp_path: Path, code: str, zygote: str, cpu_s: int = 300, device: str = "cpu",
             task: Path = ZOO / "tasks/level1/1_gelu.py") -> list[dict]:
    cand = tmp_path / "c.py"
    cand.write_text(code)
    env = {**os.environ, "ASSAY_TEST_SECRET": "sk-not-for-candidates",
           "ASSAY_SANDBOX_ZYGOTE": zygote,
           "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", HARNESS, str(task), str(cand), str(cpu_s),
                        device], env=env, capture_output=True, text=True, timeout=600)
    out = [json.loads(ln[len("VERDICT "):]) for ln in r.stdout.splitlines()
           if ln.startswith("VERDICT ")]
    assert r.returncode == 0 and len(out) == 2, r.stderr[-3000:]
    return out


@pytest.mark.parametrize("zygote", ["1", "0"])
def test_a_worker_sees_no_socket_and_no_secret_of_the_harness(tmp_path, zygote):
    """The zygote's control socket (which could ask for a fork under a spec of the
    candidate's) and the harness's environment (API keys) never reach the candidate, on the
    zygote's path as on the exec path."""
    for v in _harness(tmp_path, SNOOP, zygote):
        assert f"FINDINGS sockets=[] secret=False forked={zygote == '1'}" in v["error"], v
        assert "home=/" in v["error"] and "assay-verify-" in v["error"]  # its scratch folder
        assert v["zygotes"] == (1 if zygote == "1" else 0)


@pytest.mark.parametrize("zygote", ["1", "0"])
def test_the_cpu_limit_ends_a_spinning_worker_and_says_so(tmp_path, zygote):
    """RLIMIT_CPU binds the forked worker (its CPU time starts at the fork), and the verdict
    names the limit: the zygote reports the CPU time of the child it reaped."""
    for v in _harness(tmp_path, SPIN, zygote, cpu_s=3):
        assert "CPU time limit 3 s" in v["error"], v


def test_the_zygote_ends_when_its_harness_is_killed():
    code = ("import os\n"
            "from assay.verify.sandbox.parent import candidate_env\n"
            "from assay.verify.sandbox.zygote import Zygote\n"
            "z = Zygote.get(candidate_env())\n"
            "z._wait_ready()\n"
            "print(z.pid, flush=True)\n"
            "os.kill(os.getpid(), 9)\n")
    env = {**os.environ, "ASSAY_SANDBOX_ZYGOTE": "1",
           "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    pid = int(r.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.1)
    assert not _alive(pid), f"zygote {pid} outlived its harness"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.mark.gpu
def test_a_cuda_worker_forked_from_the_zygote_is_accepted(tmp_path):
    """The default on cuda (here forced, ASSAY_SANDBOX_ZYGOTE=1): the zygote never
    initializes CUDA, its forked worker does, and an honest kernel is accepted twice, the
    second time with torch already imported."""
    zoo = REPO / "tests" / "zoo_cuda"
    runs = _harness(tmp_path, (zoo / "candidates" / "honest_gelu_cuda.py").read_text(), "1",
                    device="cuda", task=zoo / "tasks" / "level1" / "1_gelu.py")
    assert all(v["accepted"] for v in runs), runs
    assert runs[1]["zygotes"] == 1 and runs[1]["import_s"] < 0.5, runs


def test_the_zygote_is_the_default_and_0_turns_it_off(monkeypatch):
    from assay.verify.sandbox.zygote import wanted

    monkeypatch.delenv("ASSAY_SANDBOX_ZYGOTE", raising=False)
    assert wanted()
    for value, want in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("ASSAY_SANDBOX_ZYGOTE", value)
        assert wanted() is want, value


def test_a_zygote_whose_harness_is_gone_before_it_is_ready_ends_quietly():
    """A step that ends before its prestarted zygote is ready (a degenerate task's verdicts,
    decided from its record) closes the control socket: the zygote ends with status 0 and no
    traceback in the step's log (a BrokenPipeError was printed there on an H200)."""
    code = ("import socket, sys\n"
            "from assay.verify.sandbox.zygote import serve\n"
            "ours, theirs = socket.socketpair()\n"
            "theirs.close()\n"
            "sys.exit(serve(ours.detach()))\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
