"""The exploit zoo (issue #3), cpu half: every exploit is rejected for the reason it declares,
every honest candidate is accepted, and a deliberately naive harness accepts every exploit.

Each file under tests/zoo/candidates/ declares, at module level:
  TASK    the task file (tests/zoo/tasks/<TASK>.py)
  EXPECT  reasons that must all appear in the verdict ([] = honest: must be accepted)
  ALSO    reasons that may also appear (anything else is a wrong reason)
  POLICY  strict (default) or permissive;  CONFIG  VerifyConfig overrides (timeout_s, memory_gb)
  KIND    "failure" for crashes/hangs/OOM (not exploits), "neutralized" for a trick the protocol
          makes harmless (accepted, with its real time);  NAIVE  a str: why the naive check is
          skipped;  SLOW  builds a torch extension;  GAP  a str: why the verifier accepts the
          exploit today (the verdict test is an expected failure until the gap is closed);
          OBSERVED  True: caught only by the harness's out-of-process observer (an expected
          failure, as a GAP, on a machine whose kernel refuses perf_event_open);
          FIRES  a str: when a trigger that depends on the machine's timing cheats (a run
          where it did not is accepted, rightly: the test then asks that the audit saw no
          compute op, and runs it again, up to three times, until it fires)
  CUDA    a dict of these fields that replace the file's own on the cuda target (a case of the
          cpu zoo linked into tests/zoo_cuda/ whose trick shows there through another check)
The metadata is read with ast, never by importing the candidate into the test process.
"""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import math
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from assay.tasks.model import Task
from assay.verify import observer
from assay.verify.compare import compare_tensor, reference_stats
from assay.verify.harness import prepare, verify
from assay.verify.policy import compute_ops
from assay.verify.reference import Prepared
from assay.verify.settings import SandboxLimits, Transfer, VerifyConfig
from helpers import assert_forked

ZOO = Path(__file__).parent / "zoo"
# Generous device ceilings: no honest cpu kernel comes near this floor; a faked time does.
GENEROUS_PEAKS = {"name": "test ceiling", "bandwidth_gbs": 1e4, "flops_tflops": 1e3}
_FIELDS = ("TASK", "EXPECT", "ALSO", "POLICY", "CONFIG", "KIND", "NAIVE", "SLOW", "GAP",
           "FIRES", "CUDA", "OBSERVED")
# Why this machine's kernel refuses the observer's events ("" where it takes them)
OBSERVER_OFF = observer.available()


def read_meta(path: Path, target: str = "cpu") -> dict:
    meta = {"EXPECT": [], "ALSO": [], "POLICY": "strict", "CONFIG": {}}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id in _FIELDS:
            meta[node.targets[0].id] = ast.literal_eval(node.value)
    cuda = meta.pop("CUDA", {})
    if target == "cuda":
        assert set(cuda) <= set(_FIELDS) - {"CUDA"}, (path, cuda)
        meta.update(cuda)
    meta["KIND"] = meta.get("KIND") or ("exploit" if meta["EXPECT"] else "honest")
    meta["path"] = path
    return meta


CASES = {p.stem: read_meta(p) for p in sorted((ZOO / "candidates").glob("*.py"))}
_TASKS: dict[str, Task] = {}
_PREPARED: dict[str, Prepared] = {}
_RECORDS: dict[str, dict] = {}


def zoo_task(rel: str, root: Path = ZOO) -> Task:
    key = f"{root}/{rel}"
    if key not in _TASKS:
        _TASKS[key] = Task.from_file(root / "tasks" / f"{rel}.py")
    return _TASKS[key]


def zoo_config(meta: dict) -> VerifyConfig:
    """The zoo's verify settings; the cases run on the default transfer (draw: the worker draws
    its inputs from their seeds, outputs through device memory on cuda), ZOO_TRANSFER=host on
    the shared-file path, cuda_ipc with every set copied through device memory."""
    c = meta["CONFIG"]
    return VerifyConfig(policy=meta["POLICY"], budget_s=0.1, warmup_s=0.02, min_runs=10,
                        max_runs=20, timeout_s=c.get("timeout_s", 300),
                        limits=SandboxLimits(memory_gb=c.get("memory_gb", 32)),
                        transfer=Transfer(os.environ.get("ZOO_TRANSFER", Transfer.draw)))


def prepared(task: Task, device: str = "cpu") -> Prepared:
    """One preparation per task, device and test process, reused by its candidates (as the
    verify step reuses one per generation); the settings it depends on are the same for every
    candidate."""
    key = f"{task.path}@{device}"
    if key not in _PREPARED:
        _PREPARED[key] = prepare(task, device, zoo_config({"POLICY": "strict", "CONFIG": {}}))
    return _PREPARED[key]


def record(task: Task, device: str = "cpu") -> dict:
    """The roofline's inputs: minimum bytes (every input and output once) and no FLOPs (the
    memory floor is enough here; assay.tasks.analyze.cost counts FLOPs, at the price of a
    dynamo import). No degeneracy analysis: the harness must find that by itself."""
    key = f"{task.path}@{device}"
    if key not in _RECORDS:
        prep = prepared(task, device)
        nbytes = sum(x.numel() * x.element_size() for x in prep.sets[0]
                     if isinstance(x, torch.Tensor))
        nbytes += sum(r.numel() * r.element_size() for r in prep.refs[0])
        _RECORDS[key] = {"flops": 0.0, "min_bytes": float(nbytes)}
    return _RECORDS[key]


def run_case(name: str, times: dict | None = None):
    meta = CASES[name]
    task = zoo_task(meta["TASK"])
    return verify(task, meta["path"], "cpu", zoo_config(meta), record=record(task),
                  peaks=GENEROUS_PEAKS, prepared=prepared(task), times=times)


def _param(name: str, cases: dict | None = None):
    meta = (cases or CASES)[name]
    marks = [pytest.mark.slow] if meta.get("SLOW") else []
    if meta.get("GAP"):
        marks.append(pytest.mark.xfail(reason=f"known gap: {meta['GAP']}", strict=True))
    elif meta.get("OBSERVED") and OBSERVER_OFF:
        marks.append(pytest.mark.xfail(reason=f"the observer is off here: {OBSERVER_OFF}",
                                       strict=True))
    return pytest.param(name, marks=marks, id=name)


def test_zoo_size():
    kinds = [m["KIND"] for m in CASES.values()]
    assert kinds.count("exploit") >= 20 and kinds.count("honest") >= 10, kinds


def assert_verdict(meta: dict, v) -> None:
    """The zoo's rule: accepted iff honest, every EXPECT reason present, nothing but EXPECT and
    ALSO."""
    expect, also = set(meta["EXPECT"]), set(meta["ALSO"])
    failed = {k: c["detail"][:400] for k, c in v.checks.items() if not c["passed"]}
    # what the timed calls ran and took: an exploit accepted either fooled a check or did not
    # fire (a trigger that missed), and these tell which
    seen = {"kernels": v.kernels_launched, "runtime_ms": v.runtime_ms,
            "audit": v.checks.get("audit_consistency", {}).get("detail", "")[:200]}
    assert v.accepted == (not expect), (v.reasons, failed, seen)
    # (an expected check that passed: what it saw)
    missed = {k: v.checks[k]["detail"][:400] for k in expect - set(v.reasons) if k in v.checks}
    assert expect <= set(v.reasons), (sorted(expect - set(v.reasons)), v.reasons, failed, missed)
    assert set(v.reasons) <= expect | also, (sorted(set(v.reasons) - expect - also), failed)


@pytest.mark.parametrize("name", [_param(n) for n in CASES])
def test_zoo_verdict(name, forked_workers):
    assert_forked(judge_case(name), reports(CASES[name]))


def reports(meta: dict) -> bool:
    """Whether the case's worker runs to its report: not for a crash, a candidate that raises
    at its import, or a task whose record decides the verdict (no worker starts)."""
    return meta["KIND"] != "failure" and not {"runs", "task_not_degenerate"} & set(meta["EXPECT"])


# Cases that go through workers exec'd as fresh interpreters (where the zygote cannot start, or
# ASSAY_SANDBOX_ZYGOTE=0): honest kernels of each kind, tricks on the worker's process (its
# frames and heap, a side thread, its clock, the sandbox), a crash.
EXEC_CASES = ("honest_softmax_cpp", "honest_gelu_triton",
              "honest_gemm_library_plus_epilogue_permissive", "exploit_steal_from_gc_and_frames",
              "exploit_background_thread", "exploit_patch_perf_counter", "exploit_escape_sandbox",
              "failure_segfault")


@pytest.mark.parametrize("name", [_param(n) for n in EXEC_CASES])
def test_zoo_verdict_on_exec_workers(name, exec_workers):
    times = judge_case(name)
    if reports(CASES[name]):
        assert times["import_s"] > 0.3, times  # the worker imported torch itself


def judge_case(name: str) -> dict:
    """``name``'s verdict under the zoo's rule (:func:`assert_verdict`); its ``times``."""
    meta = CASES[name]
    times: dict = {}
    v = run_case(name, times)
    for _ in range(2 if meta.get("FIRES") else 0):
        if not v.accepted:
            break
        # Its trigger did not fire (every timed call ran its own kernel: CI saw it once in
        # about twenty runs, on a loaded machine): right to accept, if nothing computed with
        # the library. Then again, for a run where it cheats.
        assert not compute_ops([{"name": k} for k in v.kernels_launched or []]), v.kernels_launched
        times.clear()
        v = run_case(name, times)
    assert_verdict(meta, v)
    if not meta["EXPECT"]:
        assert v.runtime_ms > 0 and v.kernels_launched is not None
        assert v.checks["precision"]["passed"] and v.checks["stale_results"]["passed"]
        if meta["POLICY"] == "permissive":
            assert v.library_time_frac is not None and v.library_time_frac > 0
    return times


# --- the naive harness accepts every exploit (so each one is a real exploit) -----------------

# glibc serves a freed block again only below its mmap threshold, which it moves at run time;
# pinned high, the reference's freed output is reused as a naive harness's would be in a
# long-running process (and the CUDA caching allocator always does). Even so, reuse depends on
# the heap's history, which differs from process to process (threads, hash seeds): a noop
# kernel passes in about half of fresh processes, so the test retries in new ones.
# TRITON_INTERPRET: the naive harness runs on cpu, where Triton kernels run in the interpreter
# (as the verifier's sandbox runs them for cpu workers).
NAIVE_ENV = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(1 << 30), "TRITON_INTERPRET": "1"}


def naive_once(task: Path, candidate: Path, timeout_s: float = 180.0) -> dict:
    """One request to a naive harness process of its own (a heap with another history)."""
    line = json.dumps({"task": str(task), "candidate": str(candidate), "timeout_s": timeout_s})
    r = subprocess.run([sys.executable, str(ZOO / "naive.py")], input=line + "\n", text=True,
                       capture_output=True, env=NAIVE_ENV, timeout=timeout_s + 60)
    return json.loads(r.stdout.splitlines()[-1])


# The lightest protocol the memory plan runs (float64 references for the correctness sets only,
# one timing buffer, no swapped sets, two correctness sets): the cases whose checks lose a part
# keep their verdicts, and the verdict says the protocol was lighter.
LIGHT_CASES = [n for n, m in CASES.items() if not m.get("SLOW") and not m.get("GAP") and (
    not m["EXPECT"] or {"correctness", "stale_results", "timed_outputs", "precision"}
    & set(m["EXPECT"]))]
_LIGHT: dict[str, Prepared] = {}


def prepared_lightest(task: Task) -> Prepared:
    from assay.verify.memory import Protocol, lighter_protocols, plan_for, task_shapes

    key = str(task.path)
    if key not in _LIGHT:
        cfg = zoo_config({"POLICY": "strict", "CONFIG": {}})
        full = Protocol.of(cfg)
        light = lighter_protocols(full)[-1]
        plan = plan_for(task_shapes(task.module()), light, "cpu", "host", None, None)
        plan.reductions = light.reductions(full)
        _LIGHT[key] = prepare(task, "cpu", cfg, plan)
    return _LIGHT[key]


@pytest.mark.parametrize("name", LIGHT_CASES)
def test_zoo_verdict_under_the_lightest_protocol(name, forked_workers):
    meta = CASES[name]
    task = zoo_task(meta["TASK"])
    prep = prepared_lightest(task)
    # no swap sets of its own: the second correctness set's data is swapped into a timed call
    assert (len(prep.check_sets), len(prep.timing_sets), prep.swap_sets) == (2, 1, [1])
    assert all(r is None for s in prep.timing_sets for r in prep.refs64[s])
    assert prep.one_landing
    times: dict = {}
    v = verify(task, meta["path"], "cpu", zoo_config(meta), record=record(task),
               peaks=GENEROUS_PEAKS, prepared=prep, times=times)
    # One timing buffer instead of three changes what a candidate whose behaviour depends on
    # its surroundings does between timed calls: audit_consistency may join its reasons.
    assert_verdict({**meta, "ALSO": meta["ALSO"] + ["audit_consistency"] * bool(meta["EXPECT"])},
                   v)
    assert_forked(times, reports(meta))
    if "timed_outputs" in v.checks:  # the worker ran the protocol: each call handed over
        assert "landing_compare_s" in times
        assert v.checks["memory_plan"]["passed"]
        assert "one landing buffer" in v.checks["memory_plan"]["detail"]
        assert "2 correctness sets instead of 3" in v.checks["memory_plan"]["detail"]
        assert "lighter protocol (memory plan)" in v.checks["timed_outputs"]["detail"]
        assert "still shows" in v.checks["timed_outputs"]["detail"]


RECOMPUTED_CASES = [n for n in ("honest_gelu_composed_permissive", "honest_softmax_cpp",
                                 "exploit_cache_by_data_ptr", "exploit_cache_by_id",
                                 "exploit_partial_write_half", "exploit_bf16_compute",
                                 "exploit_input_as_scratch") if n in CASES]


@pytest.mark.parametrize("lightest", [False, True], ids=["full", "lightest"])
@pytest.mark.parametrize("name", RECOMPUTED_CASES)
def test_zoo_verdict_with_the_references_recomputed(name, lightest, forked_workers):
    """The memory plan's placement ``recompute`` (cuda, where the references do not fit the
    device): nothing of the references is kept, each set's are made again when its calls are
    compared. Forced here on the cpu, the verdicts are the zoo's, with the full protocol and
    with the lightest (one landing buffer compared while the worker waits)."""
    import dataclasses as dc

    from assay.verify.memory import Protocol, lighter_protocols, plan_for, task_shapes
    from assay.verify.reference import Recomputed

    meta = CASES[name]
    task = zoo_task(meta["TASK"])
    cfg = zoo_config({"POLICY": "strict", "CONFIG": {}})
    full = Protocol.of(cfg)
    proto = lighter_protocols(full)[-1] if lightest else full
    plan = plan_for(task_shapes(task.module()), proto, "cpu", "host", None, None)
    plan = dc.replace(plan, placement="recompute", reductions=proto.reductions(full))
    prep = prepare(task, "cpu", cfg, plan)
    assert prep.placement == "recompute" and isinstance(prep.refs._rec, Recomputed)
    times: dict = {}
    v = verify(task, meta["path"], "cpu", zoo_config(meta), record=record(task),
               peaks=GENEROUS_PEAKS, prepared=prep, times=times)
    assert_verdict({**meta, "ALSO": meta["ALSO"] + ["audit_consistency"] * bool(meta["EXPECT"])},
                   v)
    assert_forked(times, reports(meta))
    assert prep.refs._rec.seconds > 0  # the comparison made them again


def test_the_landing_handshake_compares_only_the_call_that_is_due(tmp_path):
    """With one landing buffer, a marker the candidate writes ahead of its call (naming a slot
    not yet due) gets that slot no comparison (a failure), never a right answer twice."""
    from assay.verify.harness import _LandingJudge
    from assay.verify.worker import hand_over, plan_slots

    slots = plan_slots([0, 1], [2], [0], 10)
    seen: list = []
    judge = _LandingJudge(tmp_path, slots, ["view"], lambda s, views: seen.append(s) or [s])
    judge.start()
    try:
        hand_over(tmp_path, 0, "check0", timeout_s=10)
        hand_over(tmp_path, 1, "stale_new_data", timeout_s=10)  # forged: check1 is due
        hand_over(tmp_path, 2, "check1", timeout_s=10)
        hand_over(tmp_path, 3, "after0", timeout_s=10)  # forged: staleness calls are due
    finally:
        judge.stop()
    assert judge.compared == {"check0": [0], "stale_new_data": [], "check1": [1],
                              "after0": []}
    assert seen == [0, 1]


@pytest.fixture(scope="module")
def naive():
    proc = subprocess.Popen([sys.executable, str(ZOO / "naive.py")], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=NAIVE_ENV)

    def ask(task: Path, candidate: Path, timeout_s: float = 180.0) -> dict:
        proc.stdin.write(json.dumps({"task": str(task), "candidate": str(candidate),
                                     "timeout_s": timeout_s}) + "\n")
        proc.stdin.flush()
        if not select.select([proc.stdout], [], [], timeout_s + 30)[0]:
            raise TimeoutError("naive harness server did not answer")
        return json.loads(proc.stdout.readline())

    yield ask
    proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def cpu_matmul_follows_precision() -> bool:
    """Whether this CPU computes float32 matmuls in lower precision under
    ``torch.set_float32_matmul_precision("medium")`` (bf16 through oneDNN on AMX or
    AVX512-BF16; a CPU without them ignores the setting)."""
    a, b = torch.randn(256, 1024, dtype=torch.float64), torch.randn(1024, 256, dtype=torch.float64)
    exact = a @ b
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("medium")
        err = (a.float() @ b.float()).double().sub(exact).abs().max().item()
    finally:
        torch.set_float32_matmul_precision(before)
    return err > 1e-2


# Cases whose trick reaches the naive harness's own reference on some machines, and why.
NAIVE_ON_THIS_MACHINE = {
    "exploit_tf32_flags": (cpu_matmul_follows_precision,
                           "this CPU computes float32 matmuls in bf16 under precision 'medium': "
                           "the naive harness's reference, computed after the candidate's import "
                           "set it, loses the precision too, and its allclose rejects the exact "
                           "output"),
}


@pytest.mark.parametrize("name", [n for n, m in CASES.items() if m["KIND"] != "failure"])
def test_naive_harness_accepts(name, naive):
    meta = CASES[name]
    if isinstance(meta.get("NAIVE"), str):
        pytest.skip(meta["NAIVE"])
    if name in NAIVE_ON_THIS_MACHINE and NAIVE_ON_THIS_MACHINE[name][0]():
        pytest.skip(NAIVE_ON_THIS_MACHINE[name][1])
    # Whether glibc hands the reference's freed block to the candidate depends on the heap's
    # history on cpu (the CUDA caching allocator's reuse does not): the shared server's forks
    # all start from one heap, so later tries run in processes of their own. One acceptance
    # is enough for a search to find and keep the trick. exploit_partial_write_half: 8 of 20
    # tries accepted (glibc's memalign sometimes merges the freed output's block with a small
    # free chunk before it, and hands it back 64 bytes early), so up to 20 tries: all fail by
    # chance once in ~30000 runs (9 tries failed once in CI's-like suite, at 5 of 20 then).
    task = ZOO / "tasks" / f"{meta['TASK']}.py"
    r = naive(task, meta["path"])
    for _ in range(19):
        if r["accepted"]:
            break
        r = naive_once(task, meta["path"])
    assert r["accepted"], r


# --- proofs and single checks ------------------------------------------------------------------

_MIX = [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93,
        0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53, 0x2545F4914F6CDD1D, 0x94D049BB133111EB]
MIX = [m - (1 << 64) if m >= 1 << 63 else m for m in _MIX]  # as int64


def window_hash(words: torch.Tensor) -> torch.Tensor:
    """Hash of every 64-byte window (8 int64 words) starting at each word of ``words``."""
    n = words.numel() - 7
    acc = words[0:n] * MIX[0]
    for k in range(1, 8):
        acc += words[k:k + n] * MIX[k]
    return acc


def _needle_hashes(tensors: list[torch.Tensor]) -> list[tuple[int, int]]:
    """(first 8 bytes, hash of 64 bytes) of pieces of each tensor: the first window of 64 bytes
    from its start, and from its middle, whose eight words are nonzero and distinct. The
    snooping candidate gets only these, never the 64 bytes, so it cannot find its own copy of
    what it looks for. A window of zeros (or of one repeated word) would be no needle: it
    matches every such run of the process's memory, and the candidate's first-word filter then
    passes millions of words to a Python loop (the suite's `alone` stage saw the snoop grow to
    24 GB and be killed, where a reference had zeros at a piece's start). A tensor without such
    a window gives none: its bytes are everywhere."""
    out = []
    for t in tensors:
        b = t.detach().contiguous().cpu().flatten().view(torch.uint8)
        n = b.numel() // 64
        if not n:
            continue
        windows = b[:n * 64].clone().view(torch.int64).view(n, 8)
        ordered = windows.sort(dim=1).values
        good = ((windows != 0).all(dim=1)
                & (ordered[:, 1:] != ordered[:, :-1]).all(dim=1)).nonzero().flatten()
        for start in (0, n // 2):
            after = good[good >= start]
            if after.numel():
                w = windows[int(after[0])]
                out.append((int(w[0]), int(window_hash(w)[0])))
    return out


SNOOP = '''
import gc
import torch
from torch import nn
MIX = {mix!r}
NEEDLES = {needles!r}
FIRST = torch.tensor([f for f, _ in NEEDLES], dtype=torch.int64)
HASHES = [h for _, h in NEEDLES]
CHUNK = 64 << 20

def wrap(v):
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v

def search(words):
    """Needles whose 64 bytes start at a word of ``words``: the first word narrows the search,
    the hash of the 8 words decides."""
    found = set()
    n = words.numel() - 7
    if n <= 0:
        return found
    for p in torch.isin(words[:n], FIRST).nonzero().flatten().tolist():
        h = wrap(sum(int(words[p + k]) * MIX[k] for k in range(8)))
        if h in HASHES:
            found.add(HASHES.index(h))
    return found

def scan_memory():
    """Every mapping that can hold data made at run time: anonymous, writable, or a file that
    is not a shared library (read-only code and constants of .so files cannot)."""
    found, scanned = set(), 0
    mem = open("/proc/self/mem", "rb", buffering=0)
    for line in open("/proc/self/maps").read().splitlines():
        parts = line.split()
        lo, hi = (int(v, 16) for v in parts[0].split("-"))
        path = parts[5] if len(parts) > 5 else ""
        if "r" not in parts[1] or path in ("[vvar]", "[vsyscall]", "[vvar_vclock]"):
            continue
        if "w" not in parts[1] and (".so" in path or path.endswith("python3.11")
                                    or "/bin/" in path):
            continue
        pos = lo
        while pos < hi:
            n = min(CHUNK + 64, hi - pos)
            buf = bytearray(n)
            try:
                mem.seek(pos)
                got = mem.readinto(buf)
            except (OSError, ValueError, OverflowError):
                break
            if not got or got < 64:
                break
            found |= search(torch.frombuffer(buf, dtype=torch.int64, count=got // 8))
            scanned += got
            pos += min(CHUNK, got)
    return sorted(found), scanned

def scan_objects():
    hits = set()
    for o in gc.get_objects():
        if type(o) is torch.Tensor and o.numel() >= 16 and o.device.type == "cpu":
            b = o.detach().contiguous().flatten().view(torch.uint8)
            hits |= search(b[:b.numel() // 8 * 8].view(torch.int64))
    return len(hits)

class ModelNew(nn.Module):
    def forward(self, x):
        found, scanned = scan_memory()
        raise RuntimeError(f"SNOOP found={{found}} objects={{scan_objects()}} "
                           f"scanned_mb={{scanned >> 20}}")
'''


# After the parallel tests, with the cores to itself: beside another worker on the 2-core machine
# its scan ran past 900 s (suite 26) and starved the other worker's builds and memory plans.
@pytest.mark.alone
def test_nothing_to_steal(tmp_path):
    """Proof for 'reading expected values out of the process': a candidate hashes every 64-byte
    window of all of its own process memory (every readable mapping of /proc/self/mem) and of
    every tensor gc knows, looking for pieces of any expected output the harness holds (task
    dtype and float64, every input set). Nothing is there; its own input, for contrast, is."""
    task = zoo_task("level1/1_gelu")
    prep = prepared(task)
    refs = [t for rs, r64s in zip(prep.refs, prep.refs64) for t in list(rs) + list(r64s)
            if t is not None]
    # Hashing every window of its process is CPU and memory traffic: 7 s alone, past the
    # default 300 s twice in full suites on the 2-core machine (suites 13 and 17, loaded)
    cfg = zoo_config({"POLICY": "strict", "CONFIG": {"timeout_s": 900}})
    cand = tmp_path / "snoop.py"
    cand.write_text(SNOOP.format(mix=MIX, needles=_needle_hashes(refs)))
    v = verify(task, cand, "cpu", cfg, prepared=prep)
    assert "runs" in v.checks, (v.reasons, v.error, {k: c["detail"][:300] for k, c in
                                                     v.checks.items() if not c["passed"]})
    detail = v.checks["runs"]["detail"]
    assert "SNOOP found=[] objects=0" in detail, detail
    scanned = int(detail.split("scanned_mb=")[1].split()[0])
    assert scanned > 20, detail  # it really read the process's data
    inputs = [x for s in prep.sets for x in s if isinstance(x, torch.Tensor)]
    cand.write_text(SNOOP.format(mix=MIX, needles=_needle_hashes(inputs[:1])))
    v = verify(task, cand, "cpu", cfg, prepared=prep)
    assert "SNOOP found=[0, 1]" in v.checks["runs"]["detail"], v.checks["runs"]["detail"]


PARENT_PROBE = '''
import os
from torch import nn
def probe():
    out = []
    ppid = os.getppid()
    pids = [ppid] + [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]
    for pid in pids[:50]:
        for what in ("mem", "environ", "maps"):
            try:
                with open(f"/proc/{{pid}}/{{what}}", "rb") as f:
                    if what == "mem":
                        lo = int(open(f"/proc/{{pid}}/maps").readline().split("-")[0], 16)
                        f.seek(lo)
                    if f.read(16):
                        out.append(f"READ {{pid}}/{{what}}")
            except OSError:
                pass
    return out
class ModelNew(nn.Module):
    def forward(self, x):
        raise RuntimeError(f"PROBE ppid={{os.getppid()}} {{probe()}}")
'''


def test_harness_memory_is_closed(tmp_path):
    """The expected outputs live in the harness process: the worker cannot read its memory,
    maps or environment (pid namespace / unprivileged uid from the sandbox; else the harness is
    non-dumpable while the worker runs and the worker drops every capability)."""
    task = zoo_task("level1/1_gelu")
    cand = tmp_path / "probe.py"
    cand.write_text(PARENT_PROBE.format())
    v = verify(task, cand, "cpu", zoo_config({"POLICY": "strict", "CONFIG": {}}),
               prepared=prepared(task))
    detail = v.checks["runs"]["detail"]
    assert "PROBE" in detail and "READ" not in detail, detail


def test_content_cache_never_hits_while_timed():
    """Every timed call sees data no call has seen: a cache keyed on the inputs' exact content
    never hits while timed, so its median is its real compute time (>= the 50 ms it sleeps on a
    miss). With the perturbation off, the same few buffers come back and it times its hits."""
    name = "neutralized_cache_by_content"
    meta = CASES[name]
    task = zoo_task(meta["TASK"])
    cfg = zoo_config(meta)
    v = verify(task, meta["path"], "cpu", cfg, prepared=prepared(task))
    assert v.accepted and v.runtime_ms >= 45, (v.reasons, v.runtime_ms)
    cfg.perturb_timed_inputs = False
    v = verify(task, meta["path"], "cpu", cfg, prepared=prepared(task))
    assert v.runtime_ms < 30, v.runtime_ms


def test_roofline_fires_below_the_floor():
    """An honest kernel judged as if it moved 10^5 times the bytes it does: its (real) runtime
    is then 'impossible', also against the peaks measured again before the verdict, and the
    roofline check says so. (Peaks that are merely too low, as a busy machine measures them,
    are measured again: tests/test_roofline.py.)"""
    name = "honest_gelu_cpp"
    meta = CASES[name]
    task = zoo_task(meta["TASK"])
    from assay.bench.device import peaks

    heavy = {**record(task), "min_bytes": record(task)["min_bytes"] * 1e5}
    v = verify(task, meta["path"], "cpu", zoo_config(meta), record=heavy, peaks=peaks("cpu"),
               prepared=prepared(task))
    assert v.reasons == ["roofline"], v.reasons


def test_degenerate_task_from_record():
    """With the task record's degeneracy analysis the verdict comes before any worker runs."""
    from assay.tasks.analyze import degeneracy

    meta = CASES["exploit_constant_on_degenerate_task"]
    task = zoo_task(meta["TASK"])
    rec = {**record(task), "degeneracy": degeneracy(task)}
    t0 = time.perf_counter()
    v = verify(task, meta["path"], "cpu", zoo_config(meta), record=rec)
    assert v.reasons == ["task_not_degenerate"] and time.perf_counter() - t0 < 30
    flagged = verify(task, CASES[name := "exploit_constant_on_degenerate_task"]["path"], "cpu",
                     VerifyConfig(on_degenerate="flag", budget_s=0.1), record=rec,
                     prepared=prepared(task))
    assert flagged.checks["task_not_degenerate"]["passed"], name


def _long_sum_case(n_rows=64, n=16384, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, n, generator=g)
    ref, ref64 = x.sum(1), x.double().sum(1)
    seq = torch.zeros(n_rows)
    for i in range(0, n, 1024):  # fp32 accumulation in a different order: chunks of 1024
        seq = seq + x[:, i:i + 1024].sum(1)
    return x, ref, ref64, seq


def test_long_reduction_tolerance():
    """fp32 stays strict, and an honest fp32 sum of 16384 values in another order than torch's
    passes (against float64, with slack from the reference's own error and sqrt(N) rounding),
    while the same sum from bf16-rounded inputs (or off by 1e-3 relative) fails."""
    cfg = VerifyConfig()
    x, ref, ref64, seq = _long_sum_case()
    st = reference_stats(ref, ref64)
    ok = compare_tensor(seq, ref, ref64, st, cfg, reduction=16384)
    assert ok.ok and ok.precision_ok, (ok.detail, ok.precision_detail)
    bf = x.bfloat16().float().sum(1)
    bad = compare_tensor(bf, ref, ref64, st, cfg, reduction=16384)
    assert not bad.precision_ok and not bad.ok
    off = compare_tensor(ref * (1 + 1e-3), ref, ref64, st, cfg, reduction=16384)
    assert not off.ok
    # Elementwise (reduction 1): one ulp-level difference passes, 1e-4 relative does not.
    y = torch.randn(1000)
    g, g64 = torch.nn.functional.gelu(y), torch.nn.functional.gelu(y.double())
    st = reference_stats(g, g64)
    near = torch.nextafter(g, torch.full_like(g, math.inf))
    assert compare_tensor(near, g, g64, st, cfg).precision_ok
    approx = torch.nn.functional.gelu(y, approximate="tanh")
    assert not compare_tensor(approx, g, g64, st, cfg).precision_ok


def test_candidate_digest_is_stable():
    """Zoo files are content-addressed like real candidates (a changed exploit is a new one)."""
    digests = {hashlib.sha256(m["path"].read_bytes()).hexdigest() for m in CASES.values()}
    assert len(digests) == len(CASES)


def test_off_grid_data_exposes_a_bf16_mean_and_the_offset_set_too():
    """The default ``large`` set is off bf16's grid: the bf16-rounded mean (on the task's own
    data within fp32's accumulation error) is rejected for precision there, the honest fp32
    mean accepted; so with ``grid`` (the task's scale, off the grid) or the opt-in ``offset``
    set, and not with the task's own data alone."""
    task = zoo_task("level1/5_mse_loss")
    base = zoo_config({"POLICY": "strict", "CONFIG": {}})
    assert [str(d) for d in base.input_distributions] == ["native", "native", "large"]
    for dists, shows in ((base.input_distributions, "large"), (["native", "grid"], "grid"),
                         (["native", "offset"], "offset"), (["native", "native"], None)):
        # Two sets at the task's scale (native, grid) give mean squared errors of 2 +- 0.008
        # each, within the tolerance of one another in ~4% of the secret draws, and the task
        # then reads as degenerate: flagged, not refused, here, where the bf16 mean is the point.
        cfg = dataclasses.replace(base, input_distributions=list(dists), on_degenerate="flag")
        # The offset set's error is a random walk of the rounding errors: over the bound on
        # most secret draws, under it on some (2026-12-07, 8 draws on two threads: 0.87-5.1x the
        # bound, one under; 8 on one thread: 0.34-4.0x, two under). A draw under it is accepted
        # (timed_outputs catches some). CI once drew three under in a row (p ~ 1/4 each), so the
        # precision must be named on one of ten draws (p < 1e-5 at 1/4, 1e-3 at 1/2); a draw
        # that names it ends the loop. The default sets (`large`) reject it on every one.
        for attempt in range(10 if shows == "offset" else 1):
            prep = prepare(task, "cpu", cfg)
            bad, good = (verify(task, CASES[name]["path"], "cpu", cfg, record=record(task),
                                peaks=GENEROUS_PEAKS, prepared=prep)
                         for name in ("exploit_bf16_inputs_mean_loss", "honest_mse_cpp"))
            assert good.accepted, (dists, good.reasons)
            if shows is None or "precision" in bad.reasons:
                break
        if shows is None:  # the rounding averages out of the mean: why the grid matters
            assert bad.accepted, bad.reasons
            continue
        assert not bad.accepted and "precision" in bad.reasons, (dists, bad.reasons)
        assert shows in bad.checks["precision"]["detail"], bad.checks["precision"]["detail"]


def test_a_bf16_mean_is_rejected_off_the_grid_however_long_the_reduction(tmp_path):
    """On an H200 the red team's bf16-input MSE over 8 M elements passed the float64 bound
    4 x u x sqrt(N) at 0.9 of it (6.2e-4): that bound grows with the reduction, the error of
    rounded inputs does not. The same task at that size here, both MSEs accumulated in double
    as a GPU's parallel reduction is about as accurate (the zoo's own fp32 OpenMP sums drift by
    4e-3 over 4 M terms a thread, which the bound rightly rejects): the off-grid set's error
    against the task data's (inputs rounded to bf16: ~1e-6 on the task's data, 6e-4 off the
    grid) rejects the rounded one, and the honest one, which errs alike on both, passes."""
    text = (ZOO / "tasks" / "level1" / "5_mse_loss.py").read_text()
    assert "rows, cols = 128, 1024" in text
    path = tmp_path / "5_mse_loss_8m.py"
    path.write_text(text.replace("rows, cols = 128, 1024", "rows, cols = 2048, 4096"))
    task = Task.from_file(path)
    cands = {}
    for name in ("exploit_bf16_inputs_mean_loss", "honest_mse_cpp"):
        src = CASES[name]["path"].read_text()
        assert "  float s = 0.f;" in src, name
        cands[name] = tmp_path / f"{name}_double_sum.py"
        cands[name].write_text(src.replace("  float s = 0.f;", "  double s = 0.0;"))
    cfg = zoo_config({"POLICY": "strict", "CONFIG": {}})
    prep = prepare(task, "cpu", cfg)
    bad, good = (verify(task, cands[name], "cpu", cfg, record=record(task),
                        peaks=GENEROUS_PEAKS, prepared=prep)
                 for name in ("exploit_bf16_inputs_mean_loss", "honest_mse_cpp"))
    assert good.accepted, good.reasons
    assert not bad.accepted and "precision" in bad.reasons, bad.reasons
    detail = bad.checks["precision"]["detail"]
    assert "off bf16's grid" in detail and "task's own data" in detail, detail
    assert "sqrt(16777216)" not in detail, detail  # the float64 bound alone passed it


def test_rounded_inputs_compares_the_off_grid_error_with_the_task_datas():
    from assay.verify.compare import OFF_GRID_RATIO, SetError, rounded_inputs

    u = 2.0 ** -24

    def sets(native: float, large: float, own: float = 6e-8, j: int = 0) -> list[SetError]:
        return [SetError(j, "native", native, own, u, "input set 0 (native)"),
                SetError(j, "native", native / 2, own, u, "input set 1 (native)"),
                SetError(j, "large", large, own, u, "input set 2 (large)")]

    def found(errors: list[SetError]) -> list[str]:
        return rounded_inputs(errors)[0]

    # a bf16 mean: random on the task's data only (the H200's: 70-136x)
    assert found(sets(8.8e-6, 6.2e-4))
    assert not found(sets(5e-5, 6e-4))  # a long fp32 sum errs on both
    assert not found(sets(9e-8, 0.9 * OFF_GRID_RATIO * 9e-8))
    # the unit roundoff is the floor: exact outputs on the task's data prove nothing alone
    assert not found(sets(0.0, 0.9 * OFF_GRID_RATIO * u, own=0.0))
    assert not found(sets(9e-8, 0.05))  # wrong, not imprecise: correctness says so
    # the opt-in offset set loses bits to any bf16 kernel and to honest one-pass variances too
    offset = [SetError(0, "offset", 6e-4, 6e-8, u, "input set 1 (offset)"),
              SetError(0, "native", 9e-8, 6e-8, u, "input set 0 (native)")]
    assert rounded_inputs(offset) == ([], "")
    # per output: the second one's rounding shows, named by its call
    lines, most = rounded_inputs(sets(5e-5, 6e-4) + sets(9e-8, 6e-4, j=1))
    assert len(lines) == 1 and lines[0].startswith("input set 2 (large)"), lines
    assert "output 1" in most, most
    assert not found([e for e in sets(9e-8, 6e-4) if e.distribution == "large"])
    # a pass says how near it came
    lines, most = rounded_inputs(sets(5e-5, 1e-4))
    assert not lines and most.startswith("off bf16's grid at most 2x"), most


def test_the_offset_set_rejects_an_honest_one_pass_variance():
    """Why ``offset`` is opt-in: data 16x above its spread costs a one-pass fp32 variance the
    square of that level, and the honest kernel the default sets accept is rejected there."""
    name = "honest_layernorm_one_pass_cpp"
    task = zoo_task(CASES[name]["TASK"])
    cfg = dataclasses.replace(zoo_config(CASES[name]), input_distributions=["native", "offset"])
    v = verify(task, CASES[name]["path"], "cpu", cfg, record=record(task), peaks=GENEROUS_PEAKS,
               prepared=prepare(task, "cpu", cfg))
    assert not v.accepted and {"precision", "correctness"} & set(v.reasons), v.reasons


def test_interpreted_triton_kernels_show_in_the_cpu_audit():
    """target=triton on cpu: the sandbox runs Triton's interpreter (TRITON_INTERPRET=1), the
    audit lists the candidate's Triton kernel in every timed call (the worker's
    ``triton::<kernel>`` range), and the first call's time, Triton's JIT on a GPU, is reported
    apart from the load."""
    meta = CASES["honest_gelu_triton"]
    task = zoo_task(meta["TASK"])
    times: dict = {}
    v = verify(task, meta["path"], "cpu", zoo_config(meta), record=record(task),
               peaks=GENEROUS_PEAKS, prepared=prepared(task), times=times)
    assert v.accepted, v.reasons
    assert "triton::gelu_kernel" in v.kernels_launched, v.kernels_launched
    assert "all running the same code" in v.checks["audit_consistency"]["detail"]
    assert times["worker.first_call_s"] > 0 and "worker.load_s" in times


def test_a_passed_precision_check_says_how_close_it_came():
    """An accepted kernel's precision check names its closest call to the float64 bound (the
    cuda red team accepted a bf16-input MSE that the cpu run rejects by 5x: a pass that says
    nothing of its margin hides how near a trick came)."""
    v = run_case("honest_mse_cpp")
    assert v.accepted, v.reasons
    detail = v.checks["precision"]["detail"]
    assert "of the bound" in detail and "allowed" in detail and "sqrt(" in detail, detail
    ratio = float(detail.split("(closest, ")[1].split(" of the bound")[0])
    assert 0.0 <= ratio <= 1.0, detail


def test_the_cpu_target_never_takes_cuda_ipc_whatever_the_config_says():
    """cuda_ipc means nothing on cpu: the memory plan takes a cpu transfer there (draw, the
    lightest: Prepared.transfer), with no fallback recorded."""
    meta = CASES["honest_gelu_cpp"]
    task = zoo_task(meta["TASK"])
    cfg = dataclasses.replace(zoo_config(meta), transfer=Transfer.cuda_ipc)  # (ZOO_TRANSFER)
    times: dict = {}
    v = verify(task, meta["path"], "cpu", cfg, record=record(task), peaks=GENEROUS_PEAKS,
               times=times)
    assert v.accepted, v.reasons
    assert times["transfer"] == "draw" and "transfer_fallback" not in times, times


def test_a_degenerate_tasks_generation_is_judged_with_no_build_and_no_gpu(tmp_path, monkeypatch):
    """The verify step on a task its record calls degenerate (on_degenerate=reject): every
    verdict says so from the record, and no kernel is built, no worker started, no GPU taken
    (on an H200, KernelBench's L1_49 waited 9 s for the GPU and built two kernels to be told
    so). Run as on a GPU machine: target=cuda."""
    from assay import app
    from assay.layout import read_json, write_json
    from assay.steps import verify as step
    from assay.tasks.analyze import degeneracy
    from assay.verify import compile_service, harness, sandbox

    cfg = app.compose(["tasks.source=data/tasks", "tasks.size=small",
                       "tasks.include=[L2_10_Linear_LayerNorm_Mean_Degenerate]",
                       "target=cuda", f"results_dir={tmp_path}", "campaign=deg"])
    c = app.campaign(cfg)
    task_id = "L2_10_Linear_LayerNorm_Mean_Degenerate"
    task = app.load_task(cfg, task_id, "cpu")
    rec = {**record(task), "degeneracy": degeneracy(task)}
    assert rec["degeneracy"]["degenerate"]
    write_json(c.task_record(task_id), rec)
    write_json(c.baseline(task_id), {"eager_ms": 1.0, "compile_ms": None})
    meta = CASES["exploit_constant_on_degenerate_task"]
    todo = []
    for i in range(2):
        cid = f"c{i}"
        path = c.candidate("offline", task_id, 0, cid)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Path(meta["path"]).read_text())
        todo.append(cid)

    def refused(*a, **k):
        raise AssertionError("a degenerate task's generation took a build, a worker or the GPU")

    monkeypatch.setattr(compile_service, "CompileService", refused)
    monkeypatch.setattr(compile_service, "pin_cuda_arch", refused)
    monkeypatch.setattr(app, "on_device", refused)
    monkeypatch.setattr(harness, "prestart_worker", refused)
    monkeypatch.setattr(sandbox, "prestart_worker", refused)
    monkeypatch.setattr(harness, "prepare", refused)
    step.judge(cfg.copy(), c, "offline", task_id, 0, todo)
    for cid in todo:
        v = read_json(c.verdict("offline", task_id, 0, cid))
        assert v["reasons"] == ["task_not_degenerate"] and not v["accepted"], v
        assert isinstance(v["times"]["verify_s"], float), v  # where its seconds went
    # what a forged worker report puts in its times reaches the verdict file only as numbers
    # and short words
    kept = harness.reportable_times({"prepare_s": 1.5, "worker.median": [1] * 10**6,
                                     "worker.note": "x" * 10**6, "transfer": "draw",
                                     **{f"worker.k{i}": i for i in range(500)}})
    assert kept["prepare_s"] == 1.5 and kept["transfer"] == "draw"
    assert "worker.median" not in kept and len(kept["worker.note"]) == 300
    assert len(kept) <= 100
