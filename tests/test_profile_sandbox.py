"""Issue 22.1: candidate code runs only inside the verifier's sandbox, for every purpose.

A candidate that tries to read an API key, open a socket and write outside its scratch folder
(tests/zoo/candidates/exploit_escape_sandbox.py) fails at all three while verified, while
profiled by the torch profiler and while profiled by Nsight Compute (ncu runs inside the
sandbox too: a stand-in on machines without it, the real one on a GPU machine that has it).
And no process in src/ is started any other way, except the few uses listed here with why.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import socket
import threading
import uuid
from pathlib import Path

import pytest

from assay.profile.tools import ncu_command, sandboxed_worker, torch_profile
from assay.verify.harness import verify
from conftest import REPO
from test_zoo import CASES, prepared, zoo_config, zoo_task

CASE = CASES["exploit_escape_sandbox"]
FAKE_NCU = REPO / "tests" / "fake_ncu.sh"
KEYS = ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "ASSAY_TEST_SECRET")


@pytest.fixture
def lure(monkeypatch):
    """API keys in this process's environment, a TCP server on 127.0.0.1 and a folder anyone
    may write, all announced to the candidate by a beacon file it can read."""
    secret = "sk-assay-" + uuid.uuid4().hex
    for k in KEYS:
        monkeypatch.setenv(k, secret)
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    connected: list = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                connected.append(server.accept())
            except (TimeoutError, OSError):
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    tag = uuid.uuid4().hex[:12]
    outside = Path(f"/tmp/assay-escape-out-{tag}")
    outside.mkdir()
    os.chmod(outside, 0o777)  # only the sandbox stands between the candidate and this folder
    beacon = Path(f"/tmp/assay-escape-beacon-{tag}.json")
    beacon.write_text(json.dumps({"port": server.getsockname()[1], "dir": str(outside)}))
    os.chmod(beacon, 0o644)
    try:
        yield {"secret": secret, "connected": connected, "outside": outside,
               "port": server.getsockname()[1]}
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
        beacon.unlink(missing_ok=True)
        shutil.rmtree(outside, ignore_errors=True)


def escape_report(text: str) -> dict:
    assert "ESCAPE-REPORT " in text, text[-2000:]
    return json.JSONDecoder().raw_decode(text.split("ESCAPE-REPORT ", 1)[1])[0]


def assert_contained(report: dict, lure: dict, isolation: dict[str, str], where: str) -> None:
    """Every attempt failed: no key, no connection, no file outside the scratch; the scratch
    itself was writable (the candidate really ran there)."""
    assert report.get("scratch") == "ok", (where, report)
    assert report["keys"] == {}, (where, report["keys"])
    assert lure["secret"] not in json.dumps(report), where
    if isolation.get("network", "").startswith("on"):
        assert f"127.0.0.1:{lure['port']}" in report["sockets"], (where, report)
        assert all(v.startswith("refused") for v in report["sockets"].values()), \
            (where, report["sockets"])
        assert not lure["connected"], f"{where}: the candidate reached 127.0.0.1"
    if isolation.get("filesystem", "").startswith("on"):
        assert any(p.startswith(str(lure["outside"])) for p in report["writes"]), (where, report)
        assert all(v.startswith("refused") for v in report["writes"].values()), \
            (where, report["writes"])
        assert not any(lure["outside"].iterdir()), where
    missing = {k: v for k, v in isolation.items()
               if k in ("network", "filesystem") and not v.startswith("on")}
    if missing:
        pytest.skip(f"{where}: keys shown kept out; this machine lacks {missing}")


def _isolation(v) -> dict[str, str]:
    line = v.checks["sandbox"]["detail"]
    if line.startswith("sandbox complete"):
        return {"network": "on", "filesystem": "on"}
    return {k: ("off" if f"{k} off" in line else "on") for k in ("network", "filesystem")}


def test_escape_fails_while_verified(lure):
    task = zoo_task(CASE["TASK"])
    v = verify(task, CASE["path"], "cpu", zoo_config(CASE), prepared=prepared(task))
    assert v.reasons == ["runs"], v.reasons
    assert_contained(escape_report(v.checks["runs"]["detail"]), lure, _isolation(v), "verify")


def test_escape_fails_while_torch_profiled(lure):
    task = zoo_task(CASE["TASK"])
    text = torch_profile(prepared(task), CASE["path"], zoo_config(CASE))
    assert text.startswith("profile run failed"), text
    # The same sandbox as verification: its layers, read from a verify run of the same machine.
    v = verify(task, CASE["path"], "cpu", zoo_config(CASE), prepared=prepared(task))
    assert_contained(escape_report(text), lure, _isolation(v), "torch profiler")


def _ncu_prefixes() -> list:
    real = shutil.which("ncu")
    return [pytest.param(str(FAKE_NCU), "cpu", id="stand-in"),
            pytest.param(real, "cuda", id="ncu", marks=[
                pytest.mark.gpu, pytest.mark.skipif(real is None, reason="no ncu here")])]


@pytest.mark.parametrize("ncu,device", _ncu_prefixes())
def test_escape_fails_while_ncu_profiled(lure, ncu, device):
    """ncu goes in front of the worker *inside* the sandbox: the profiler sees the sandbox's
    environment (no keys), and so does the candidate it launches."""
    root = REPO / "tests" / ("zoo" if device == "cpu" else "zoo_cuda")
    task = zoo_task(CASE["TASK"], root)
    with sandboxed_worker(prepared(task, device), CASE["path"], zoo_config(CASE),
                          ncu_command(ncu, ["gpu__time_duration.sum"],
                                      ["void assay_probe<4>(float const*, long)"]), 300,
                          audit=False) as (out, res, scr):
        log = (scr / "ncu.csv").read_text(errors="replace") if (scr / "ncu.csv").exists() else ""
        own = (scr / "escape.json").exists()
    assert res is not None and "ESCAPE-REPORT" in res.get("error", ""), (out, res)
    assert own, "the candidate could not write its own scratch"
    if ncu == str(FAKE_NCU):
        assert log.startswith("# fake ncu"), (out, log)
    assert lure["secret"] not in log and not any(f"{k}=" in log for k in KEYS), log
    assert_contained(escape_report(res["error"]), lure, out.isolation, f"ncu {ncu}")


def test_ncu_profiles_the_candidates_kernels_only():
    """With the verdict's kernel names, ncu profiles launches of those functions (two each),
    not the first 20 launches of anything: at KernelBench's sizes those were mostly the
    harness's fills and copies of gigabyte buffers, each replayed per counter pass. A name
    with no function identifier, or more names than 20 launches cover, leaves the filter off
    (the unfiltered run)."""
    from assay.profile.tools import kernel_function

    assert kernel_function("void assay_scan_block<4>(float const*, float*, long)") \
        == "assay_scan_block"
    assert kernel_function("assay_total_finish0(float const*, double const*, int)") \
        == "assay_total_finish0"
    assert kernel_function("void at::native::elementwise_kernel<128, 4>(int)") \
        == "elementwise_kernel"
    assert kernel_function("triton_poi_fused_relu_0") == "triton_poi_fused_relu_0"
    assert kernel_function("(anonymous namespace)::k(int)") is None
    cmd = ncu_command("ncu", ["dram__bytes.sum"], [
        "void assay_total_pass0<4>(float const*, float*, long)",
        "assay_total_finish0(float const*, double const*, int)",
        "void assay_total_pass0<2>(float const*, float*, long)"])
    at = {a: cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a.startswith("--")}
    assert at["--kernel-name-base"] == "function"
    assert at["--kernel-name"] == "regex:(assay_total_finish0|assay_total_pass0)"
    assert at["--launch-count"] == "4" and at["--log-file"] == "ncu.csv"
    many = [f"void k{i}(int)" for i in range(11)]  # more than 20 launches' worth
    for kernels in ([], ["(anonymous namespace)::k(int)", "void f(int)"], many):
        cmd = ncu_command("ncu", ["dram__bytes.sum"], kernels)
        assert "--kernel-name" not in cmd and cmd[cmd.index("--launch-count") + 1] == "20"


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("ncu") is None, reason="no ncu here")
def test_real_ncu_records_the_named_kernels_and_nothing_else():
    """On the GPU machine, the filter as the real ncu reads it: an honest CUDA kernel verified,
    its verdict's kernel names given to ncu, and what ncu recorded is launches of those
    functions only (none of the harness's fills and copies), no more than the launch count."""
    import csv
    import io

    from assay.profile.tools import kernel_function
    from test_zoo import read_meta

    meta = read_meta(REPO / "tests" / "zoo_cuda" / "candidates" / "honest_gelu_cuda.py", "cuda")
    task = zoo_task(meta["TASK"], REPO / "tests" / "zoo_cuda")
    prep = prepared(task, "cuda")
    v = verify(task, meta["path"], "cuda", zoo_config(meta), prepared=prep)
    assert v.accepted and v.kernels_launched, (v.reasons, v.kernels_launched)
    cmd = ncu_command(shutil.which("ncu"), ["gpu__time_duration.sum"], v.kernels_launched)
    wanted = {kernel_function(k) for k in v.kernels_launched}
    with sandboxed_worker(prep, meta["path"], zoo_config(meta), cmd, 300, audit=False) \
            as (out, res, scr):
        text = (scr / "ncu.csv").read_text(errors="replace") if (scr / "ncu.csv").exists() \
            else ""
    rows = list(csv.DictReader(io.StringIO(
        "\n".join(ln for ln in text.splitlines() if ln.startswith('"')))))
    launches = {(r["ID"], r["Kernel Name"]) for r in rows}
    assert launches, (out, text[-3000:])
    assert {kernel_function(name) for _, name in launches} <= wanted, launches
    assert len(launches) <= int(cmd[cmd.index("--launch-count") + 1]), launches


# --- no process is started around the sandbox ----------------------------------------------

# Every way src/ starts a process or runs code in another one, each allowed use with why. A new
# use fails this test until it is routed through assay.verify.sandbox.run_sandboxed (candidate
# code, a profiler of it, a build of its sources) or added here with the reason it is not
# candidate code.
STARTERS = {"subprocess": {"run", "Popen", "call", "check_call", "check_output", "getoutput",
                           "getstatusoutput"},
            "os": {"system", "popen", "execv", "execve", "execvp", "execvpe", "execl", "execle",
                   "execlp", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe", "spawnl",
                   "spawnle", "posix_spawn", "posix_spawnp", "fork", "forkpty"},
            "pty": {"spawn", "fork"}, "multiprocessing": {"Process", "Pool", "get_context"},
            "ctx": {"Process"}}
ALLOWED = {
    ("assay/verify/sandbox/parent.py", "_start"): "the sandbox launcher itself (exec path)",
    ("assay/verify/sandbox/zygote.py", "_start"): "the zygote: imports torch, runs nothing of "
                                                  "a candidate's before the launcher's set-up",
    ("assay/verify/sandbox/zygote.py", "serve"): "the zygote's fork: the child runs the "
                                                 "launcher's set-up (launch) before the worker",
    ("assay/verify/sandbox/launcher.py", "launch"): "the launcher: forks its pid-namespace "
                                                    "relay and execs the sandboxed command "
                                                    "after setting it up",
    ("assay/bench/build.py", "build"): "the compiler on a kernel source: called by candidates "
                                       "at import, so only inside the worker or the compile "
                                       "service's prebuild, both sandboxed (checked below)",
    ("assay/profile/tools.py", "clang_tidy"): "clang-tidy reads the candidate's C sources as "
                                              "text; it runs none of the candidate's code",
    ("assay/tasks/record.py", "_start_child"): "runs a task file (the trusted reference), "
                                                 "not a candidate: a fresh interpreter, or a "
                                                 "fork of its step",
    ("assay/stepserver.py", "_start_server"): "the step server: imports torch and the steps' "
                                              "packages, runs no candidate",
    ("assay/stepserver.py", "serve"): "the step server's fork: the child is a pipeline step, "
                                      "which routes candidates through the sandbox as any step",
    ("assay/cli.py", "_run"): "starts snakemake",
    ("assay/bench/baseline_cache.py", "__init__"): "TrustedChild: times the task's reference "
                                                    "(trusted) in a process that never loads a "
                                                    "candidate",
    ("assay/gpu.py", "_nvidia_smi"): "nvidia-smi: the GPUs and their architecture",
    ("assay/bench/prewarm.py", "prewarm"): "compiles the task's reference (trusted) with "
                                           "torch.compile on fake tensors; loads no candidate",
}


def _process_starts(path: Path) -> list[tuple[str, int, str]]:
    """(enclosing function, line, call) of each process start in one source file."""
    tree = ast.parse(path.read_text())
    out = []

    def visit(node: ast.AST, fn: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                else fn
            if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) \
                    and isinstance(child.func.value, ast.Name) \
                    and child.func.attr in STARTERS.get(child.func.value.id, ()):
                out.append((fn, child.lineno, f"{child.func.value.id}.{child.func.attr}"))
            visit(child, name)

    visit(tree, "<module>")
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.module in STARTERS for a in n.names if a.name in STARTERS[n.module]}
    for n in ast.walk(tree):  # `from subprocess import run` then run(...): a use too
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in imported:
            out.append(("?", n.lineno, n.func.id))
    return out


def test_no_process_starts_outside_the_sandbox():
    src = REPO / "src"
    found = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src).as_posix()
        for fn, line, call in _process_starts(path):
            found.setdefault((rel, fn), []).append(f"{rel}:{line} {call}")
    unlisted = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not unlisted, ("processes started outside assay.verify.sandbox.run_sandboxed; route "
                          f"candidate code through it or list the use with why: {unlisted}")
    stale = set(ALLOWED) - set(found)
    assert not stale, f"allowed uses that no longer exist (remove them): {stale}"
    text = (src / "assay/profile/tools.py").read_text()
    assert "assay.verify.worker" in text and "run_sandboxed(" in text


def test_candidate_builds_happen_only_in_sandboxed_processes():
    """bench.build compiles a candidate's source (candidate-controlled compiler input): only
    code that runs inside the sandbox may call it. In src/ that is the candidates' own import
    (load_library) and the two sandboxed entry points that import candidates."""
    src = REPO / "src"
    callers = set()
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text())
        names = {a.asname or a.name for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module == "assay.bench.build"
                 for a in n.names if a.name in ("build", "load_library")}
        rel = path.relative_to(src).as_posix()
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names:
                callers.add(rel)
    # candidate.py writes candidate files (its load_library call is in generated source text,
    # not a call here); build.py's own load_library calls build.
    assert callers <= {"assay/bench/build.py"}, callers
    for entry in ("assay/verify/worker.py", "assay/bench/prebuild.py"):
        assert "exec_module" in (src / entry).read_text(), entry
