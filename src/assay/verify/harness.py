"""Run and judge: the candidate's worker in the sandbox, and the named checks on what it reported.

The harness process holds the reference model and the expected outputs (in the task's dtype and
in float64, :mod:`assay.verify.reference`); the candidate runs in a worker process it spawns
(``assay.verify.worker``) through the sandbox (:mod:`assay.verify.sandbox`) and only ever
returns outputs, through landing buffers (:mod:`assay.verify.arenas`) the harness reads after
the worker has exited and compares on the task's device (:mod:`assay.verify.compare`). Every
decision is a named check recorded in the verdict; a failed check's name is its reason.

What else the worker reports is plain JSON, never unpickled. While a worker runs, the harness is
not dumpable and the worker has dropped every capability, so it cannot read this process's
memory.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import secrets
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from assay.gpu import DeviceTurns, turns_alone, turns_shared
from assay.records import Verdict
from assay.tasks.model import Task
from assay.verify import checks, observer
from assay.verify import policy as policy_mod
from assay.verify import provenance
from assay.verify.memory import Plan, TooLarge, plan_slots
from assay.verify.preflight import preflight
from assay.verify.arenas import (ALIGN, DeviceArena, FileArena, Layout, NoRoom, arena_view,
                                 describe_inputs, fill_inputs, shm_dir, tensor_nbytes)
from assay.verify.compare import SetError, compare_tensor, rounded_inputs, unit_roundoff
from assay.verify.reference import Prepared, prepare, resolve_device
from assay.verify.sandbox import prestart_worker, run_sandboxed
from assay.verify.sandbox.host import kernel_cache
from assay.verify.settings import VerifyConfig

log = logging.getLogger("assay.verify")

__all__ = ["verify", "prepare", "Prepared", "worker_job", "WorkerRun", "roofline_ms"]


def roofline_ms(record: dict[str, Any] | None, peaks: dict[str, Any] | None) -> float | None:
    """The fastest any implementation could be: max(bytes / bandwidth, FLOPs / peak), the FLOPs
    of ops that no algorithm does with less (``floor_flops``: convolutions left out; a record
    made before it existed counts them all)."""
    if not record or not peaks:
        return None
    t_bytes = record.get("min_bytes", 0.0) / (peaks["bandwidth_gbs"] * 1e9)
    t_flops = record.get("floor_flops", record.get("flops", 0.0)) / (peaks["flops_tflops"] * 1e12)
    return max(t_bytes, t_flops) * 1e3


# --------------------------------------------------------------------------------------------
# The worker run.

_DUMP_LOCK = threading.Lock()
_DUMP_DEPTH = [0, 1]  # active runs, the dumpable value to restore


@contextlib.contextmanager
def _private_memory():
    """While a worker runs this process is not dumpable: /proc/<pid>/mem, maps and environ are
    closed to processes without CAP_SYS_PTRACE (the worker drops it)."""
    libc = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            libc = ctypes.CDLL(None, use_errno=True)
    with _DUMP_LOCK:
        if libc is not None and _DUMP_DEPTH[0] == 0:
            prev = libc.prctl(3, 0, 0, 0, 0)  # PR_GET_DUMPABLE
            _DUMP_DEPTH[1] = prev if prev in (0, 1) else 1
            libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0
        _DUMP_DEPTH[0] += 1
    try:
        yield
    finally:
        with _DUMP_LOCK:
            _DUMP_DEPTH[0] -= 1
            if libc is not None and _DUMP_DEPTH[0] == 0:
                libc.prctl(4, _DUMP_DEPTH[1], 0, 0, 0)


def _job_base(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> dict[str, Any]:
    return {
        "candidate": str(candidate), "device": prep.device, "init_seed": prep.init_seed,
        "check_sets": prep.check_sets, "timing_sets": prep.timing_sets,
        "swap_sets": prep.swap_sets, "swap_seed": secrets.randbits(31),
        "poison_bytes": prep.poison_bytes, "audit": cfg.audit, "allow_tf32": cfg.allow_tf32,
        "perturb": cfg.perturb_timed_inputs, "settle_s": cfg.settle_s,
        "timing": {"warmup_s": cfg.warmup_s, "min_runs": cfg.min_runs, "max_runs": cfg.max_runs,
                   "budget_s": cfg.budget_s, "flush_cache": True},
    }


def _draw(prep: Prepared) -> dict[str, Any]:
    """The job's ``draw``: the worker draws every set from its seed, checked against these
    digests."""
    return {"task": prep.task, "seeds": prep.seeds, "distributions": prep.distributions,
            "digests": prep.digests}


def _filled_inputs(prep: Prepared, sets: bool,
                   make: Callable[[int, str], Any]) -> tuple[Any, dict[str, Any]]:
    """The input arena, made by ``make(nbytes, prefix)`` and filled with every set (none where
    ``sets`` is False: the worker draws them), the state dict and the init inputs; and the
    descriptors of what is where."""
    layout = Layout("in")
    descs = describe_inputs(prep, layout, sets=sets)
    arena = make(layout.size, "params-")
    fill_inputs(arena.buf, prep, descs)
    return arena, descs


def worker_job(prep: Prepared, candidate: Path, cfg: VerifyConfig) -> dict[str, Any]:
    """A job without landing buffers (the worker runs the protocol, reports and profiles, and
    writes ``result.pt`` as well as ``result.json``): for tools that only want the profile.
    Where the memory plan draws (``prep.transfer``), the worker draws the sets too, with the
    parameters in a small file arena beside ``candidate`` (in the scratch folder, removed with
    it): the profile step's run at KernelBench's sizes took 5 s per GB of a set copied to the
    host and back (an H200, 2026-12-02); otherwise the sets come from the host input arena."""
    job = _job_base(prep, candidate, cfg)
    if prep.transfer == "draw":
        params, descs = _filled_inputs(
            prep, False, lambda nbytes, prefix: FileArena(nbytes, prefix, Path(candidate).parent))
        job.update(arenas={"in": params.spec(writable=False)}, draw=_draw(prep), **descs)
        return job
    inputs = prep.host_inputs()
    job.update(arenas={"in": inputs["arena"].spec(writable=False)}, **inputs["descs"])
    return job


class WorkerRun:
    """One candidate in one worker: job, arenas, sandboxed process, parsed report, landing."""

    def __init__(self, prep: Prepared, candidate: Path, cfg: VerifyConfig,
                 times: dict[str, Any], transfer: str = "host"):
        self.prep, self.cfg, self.times = prep, cfg, times
        self.transfer = transfer
        self.result: dict[str, Any] | None = None
        self.outcome = ""
        self.landing: dict[str, list[torch.Tensor]] = {}
        self.tampered_inputs = False
        self.sampled = None  # the out-of-process observer's samples (cpu: verify/observer.py)
        # One landing buffer for every call (a lighter memory protocol): each call's outputs
        # are compared while the worker waits (:class:`_LandingJudge`), kept here per slot.
        self.compared: dict[str, list[Any]] | None = None
        self._arenas: list[Any] = []
        # The landing arena lives in the scratch folder (the one place the worker may write):
        # on /dev/shm when it has room for it, so nothing goes through a disk.
        one = sum(tensor_nbytes(shape, dtype) + ALIGN for shape, dtype, _ in prep.out_meta)
        landing = one if prep.one_landing else one * len(prep.sets)
        self.scratch = Path(tempfile.mkdtemp(prefix=f"assay-verify-{os.getpid()}-",
                                             dir=shm_dir(landing)))
        self.candidate = candidate
        # The @triton.jit kernels its file defines, read here before the worker runs (the copy
        # in the scratch folder is the candidate's to rewrite): the audit counts them as its
        # own even where their names look like a library's (policy.is_library).
        try:
            self.own_kernels = policy_mod.triton_kernels(
                Path(candidate).read_text(errors="replace"))
        except OSError:
            self.own_kernels = frozenset()

    def __enter__(self) -> "WorkerRun":
        return self

    def __exit__(self, *exc) -> None:
        self.landing = {}
        for a in self._arenas:
            with contextlib.suppress(Exception):
                a.close()
        self._arenas = []
        shutil.rmtree(self.scratch, ignore_errors=True)

    def run(self) -> None:
        prep, cfg, times = self.prep, self.cfg, self.times
        t = time.perf_counter()
        # The user's file name, so the worker's tracebacks and messages name their file.
        name = self.candidate.name
        cand_copy = self.scratch / (name if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.py", name)
                                    else "candidate.py")
        shutil.copyfile(self.candidate, cand_copy)
        job = _job_base(prep, cand_copy, cfg)
        slots = plan_slots(prep.check_sets, prep.timing_sets, prep.swap_sets, cfg.min_runs)
        out_layout = Layout("out")
        # every set's outputs have the same shapes and dtypes (prep.out_meta)
        if prep.one_landing:
            shared = [out_layout.add(shape, dtype) for shape, dtype, _ in prep.out_meta]
            landing_descs = {name: shared for name, _, _ in slots}
        else:
            landing_descs = {name: [out_layout.add(shape, dtype)
                                    for shape, dtype, _ in prep.out_meta]
                             for name, _, _ in slots}
        drawn = self.transfer == "draw"
        on_device = prep.device.startswith("cuda") and self.transfer in ("cuda_ipc", "draw")
        if drawn:
            job["draw"] = _draw(prep)
        # what preparing left in this process's cache first: the arenas come from a private
        # pool that cannot reuse it (an H200 self-check's 88 GB landing arena did not fit
        # beside 41 GB its harness had cached)
        prep.release_transients()
        if on_device or drawn:  # (draw on cpu: the parameters' own small file arena)
            def arena(nbytes: int, prefix: str) -> Any:  # closed with this run
                a = DeviceArena(nbytes, prep.device) if on_device else \
                    FileArena(nbytes, prefix, self.scratch)
                self._arenas.append(a)
                return a

            a_in, descs = _filled_inputs(prep, not drawn, arena)
            a_out = arena(out_layout.size, "landing-")
            a_out.buf.fill_(0xFF)  # NaN-looking until written
            if on_device:
                torch.cuda.synchronize()
            arenas = {"in": a_in.spec(writable=False), "out": a_out.spec(True)}
        else:
            t_in = time.perf_counter()
            inputs = prep.host_inputs()
            times["inputs_arena_s"] = times.get("inputs_arena_s", 0.0) + time.perf_counter() - t_in
            descs = inputs["descs"]
            a_out = FileArena(out_layout.size, "landing-", self.scratch)
            self._arenas.append(a_out)
            arenas = {"in": inputs["arena"].spec(writable=False), "out": a_out.spec(True)}
        job.update(arenas=arenas, landing=landing_descs, result_format="json",
                   landing_handshake=prep.one_landing, **descs)
        torch.save(job, self.scratch / "job.pt")
        times["job_s"] = time.perf_counter() - t

        prep.release_transients()  # after the arenas are filled: their copies' cache too
        if prep.device.startswith("cuda"):  # what the worker starts with (a report's diagnostics)
            free, _total = torch.cuda.mem_get_info(prep.device)
            times["device_free_gib"] = round(free / 2**30, 2)
            times["harness_reserved_gib"] = round(torch.cuda.memory_reserved(prep.device) / 2**30,
                                                  2)
        t = time.perf_counter()
        judge = None
        if prep.one_landing:
            judge = _LandingJudge(self.scratch, slots, [arena_view(a_out.buf, d)
                                                        for d in landing_descs[slots[0][0]]],
                                  lambda s, vals: _compare_landed(prep, s, vals, self.cfg))
            self.compared = judge.compared
            judge.start()
        # On cpu the report's audit comes from the candidate's own process: the worker's
        # threads are sampled from this one as well (the kernel writes the samples)
        sampler = observer.CpuSampler() if cfg.audit and prep.device == "cpu" else None
        try:
            with _private_memory():
                self.outcome = run_sandboxed([sys.executable, "-m", "assay.verify.worker",
                                              str(self.scratch)], self.scratch, cfg.timeout_s,
                                             cfg.limits, device=prep.device,
                                             on_start=sampler.attach if sampler else None)
        finally:
            if sampler is not None:
                self.sampled = sampler.stop()
            if judge is not None:
                judge.stop()
                times["landing_compare_s"] = judge.seconds
        t_done = time.perf_counter()
        times["worker_s"] = t_done - t
        self.tampered_inputs = self.transfer == "host" and prep.inputs_tampered()

        result_file = self.scratch / "result.json"
        if result_file.exists():
            try:
                self.result = json.loads(result_file.read_text())
                if not isinstance(self.result, dict):
                    raise ValueError("not an object")
            except (ValueError, OSError) as e:
                self.result = {"stage": "report", "error": f"unreadable worker report: {e}"}
            r = self.result
            with contextlib.suppress(TypeError, ValueError, KeyError):
                times["spawn_s"] = float(r["t_start"]) - t
                times["import_s"] = float(r["t_torch"]) - float(r["t_start"])
                times["exit_s"] = t_done - float(r["t_end"])
            if isinstance(r.get("times"), dict):
                times.update({f"worker.{k}": v for k, v in r["times"].items()})
            if "error" in r:
                times["worker.failed_in"] = str(r.get("stage"))
        if isinstance(a_out, FileArena) and not a_out.intact_size():
            self.result = {"stage": "report", "error": "the landing arena was truncated"}
            return
        t = time.perf_counter()
        if not prep.one_landing:  # (one landing buffer: compared during the run)
            self.landing = {name: [arena_view(a_out.buf, d) for d in ds]
                            for name, ds in landing_descs.items()}
        times["landing_map_s"] = time.perf_counter() - t


class _LandingJudge(threading.Thread):
    """The harness's side of the landing handshake (``assay.verify.worker.hand_over``): waits
    for each ``landed-<n>`` the worker writes, compares the landing buffer with the
    references of the slot it names, then lets the worker go on (``ack-<n>``).

    The slot must be the next in the protocol's order (the after-timing calls in any order),
    so a marker written ahead of its call by the candidate compares the previous call's
    outputs against another set's references, never a right answer twice."""

    def __init__(self, scratch: Path, slots: list, views: list, compare):
        super().__init__(daemon=True)
        self.scratch, self.views, self.compare = scratch, views, compare
        self.order = [(name, s) for name, phase, s in slots if phase != "after"]
        self.after = {name: s for name, phase, s in slots if phase == "after"}
        self.compared: dict[str, list[Any]] = {}
        self.seconds = 0.0
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=60)

    def _expected(self, name: str) -> int | None:
        """The set of slot ``name`` if it is the one due now, else None."""
        due = next(((n, s) for n, s in self.order if n not in self.compared), None)
        if due is not None:
            return due[1] if name == due[0] else None
        return self.after.get(name) if name not in self.compared else None

    def run(self) -> None:
        seq = 0
        while not self._halt.is_set():
            marker = self.scratch / f"landed-{seq}"
            if not marker.exists():
                time.sleep(0.002)  # a light poll: the worker may be timing on these cores
                continue
            t = time.perf_counter()
            try:
                name = marker.read_text()[:64]
                s = self._expected(name)
                self.compared.setdefault(name, [] if s is None else self.compare(s, self.views))
            except Exception as e:  # noqa: BLE001 - recorded as that slot's finding
                self.compared.setdefault(f"error-{seq}", [f"{type(e).__name__}: {e}"])
            finally:
                (self.scratch / f"ack-{seq}").touch()
                self.seconds += time.perf_counter() - t
            seq += 1


def _compare_landed(prep: Prepared, s: int, values: list, cfg: VerifyConfig) -> list:
    """Each landed output of a call on input set ``s`` against that set's references."""
    return [compare_tensor(v.to(r.device), r, prep.refs64[s][j], prep.stats[s][j], cfg,
                           prep.reduction, device=prep.device)
            for j, (v, r) in enumerate(zip(values, prep.refs[s]))]


def reportable_times(times: dict[str, Any], digits: int | None = None) -> dict[str, Any]:
    """``verify``'s seconds per phase as files and JSON lines keep them: numbers (floats to
    ``digits`` decimals when given) and words cut to 300 characters, at most 100 entries. The
    worker's part (``worker.*``) comes from its report, which the candidate's process writes:
    nothing of any size or kind from there reaches a verdict file."""
    kept: dict[str, Any] = {}
    for k, x in list(times.items())[:100]:
        if isinstance(x, float) and digits is not None:
            x = round(x, digits)
        if isinstance(x, (bool, int, float)):
            kept[str(k)[:80]] = x
        elif isinstance(x, str):
            kept[str(k)[:80]] = x[:300]
    return kept


# --------------------------------------------------------------------------------------------
# Verify and judge.

def verify(task: Task, candidate: Path, device: str = "auto", cfg: VerifyConfig | None = None,
           baseline: dict[str, Any] | None = None, record: dict[str, Any] | None = None,
           peaks: dict[str, Any] | None = None, prepared: Prepared | None = None,
           times: dict[str, Any] | None = None, plan: Plan | None = None,
           turns: DeviceTurns | None = None) -> Verdict:
    """Judge one candidate file against one task. Never raises for anything the candidate does.
    ``times`` (optional) receives where the time went (prepare, transfer, worker, compare);
    ``plan``: the memory plan when the caller made one (else :func:`prepare` makes it);
    ``turns``: where verifications share a device, the worker run holds it alone and the
    preparation and comparison share it (:class:`assay.gpu.DeviceTurns`)."""
    cfg = cfg or VerifyConfig()
    times = times if times is not None else {}
    device = resolve_device(device)
    t0 = time.perf_counter()
    v = Verdict(candidate=Path(candidate).stem, task=task.id, device=device, policy=cfg.policy)
    if baseline:
        v.baseline_eager_ms = baseline.get("eager_ms")
        v.baseline_compile_ms = baseline.get("compile_ms")
    v.roofline_ms = roofline_ms(record, peaks)

    def done(error: str | None = None) -> Verdict:  # every way out: the verdict and its time
        if error is not None:
            v.error = error
        v.verify_s = times["verify_s"] = time.perf_counter() - t0
        return v.finish()

    why = preflight(Path(candidate))
    if why:  # no worker, no preparation: the file cannot be what a worker would load
        checks.record(v, "compiles", False, why)
        return done(why)
    degenerate = bool(record and record.get("degeneracy", {}).get("degenerate"))
    if degenerate:
        detail = record["degeneracy"].get("why", "output barely depends on the inputs")
        if not checks.record(v, "task_not_degenerate", cfg.on_degenerate != "reject", detail):
            return done(f"task {task.id} is degenerate: {detail}")
    prestart_worker()  # its torch import overlaps the preparation

    t = time.perf_counter()
    try:
        with turns_shared(turns):
            prep = prepared or prepare(task, device, cfg, plan)
    except TooLarge as e:
        checks.record(v, "too_large", False, str(e))
        return done(f"task {task.id} is too large for this machine: {e}")
    if prepared is None:
        times["prepare_s"] = time.perf_counter() - t
    else:  # prepared by the caller: its seconds where it measured them (assay verify on cpu)
        times.setdefault("prepare_s", 0.0)
    if prep.reductions:  # lighter than the config's protocol, to fit memory: said, never silent
        checks.record(v, "memory_plan", True,
                      "lighter protocol to fit memory: " + "; ".join(prep.reductions.values()))
    if prep.degenerate and not degenerate:
        if not checks.record(v, "task_not_degenerate", cfg.on_degenerate != "reject",
                             prep.degenerate):
            return done(f"task {task.id} is degenerate: {prep.degenerate}")

    transfer = prep.transfer  # the memory plan's (assay.verify.memory.plan_transfers)
    for attempt in (transfer, "host"):
        with WorkerRun(prep, Path(candidate), cfg, times, attempt) as w:
            try:
                with turns_alone(turns):
                    w.run()
            except NoRoom as e:  # the host path's arenas: no file system has room for them
                checks.record(v, "too_large", False, str(e))
                v.error = f"task {task.id} is too large for this machine: {e}"
                break
            except Exception as e:  # noqa: BLE001 - arena setup failed: fall back to host
                if attempt == "host":
                    raise
                times["transfer_fallback"] = f"{type(e).__name__}: {e}"[:300]
                continue
            r = w.result
            if attempt != "host" and r is not None and r.get("stage") == "start" \
                    and "error" in r:
                # the worker could not open the device arena or drew other sets than these
                # (instantiate.InputsDiffer): not the candidate's fault, nor the next one's
                times["transfer_fallback"] = str(r.get("error"))[:300]
                prep.transfer = "host"
                continue
            times["transfer"] = attempt
            t = time.perf_counter()
            with turns_shared(turns):
                _judge(v, prep, w, cfg,
                       remeasure=lambda: _remeasured_roofline(device, record, peaks))
            times["compare_s"] = time.perf_counter() - t
        break
    return done()


class _Malformed(Exception):
    """The worker's report lacks a field or has one of the wrong type."""


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _in_candidate(tb: Any, candidate: Path) -> str:
    """'<the user's file>, line N: ' for the innermost traceback frame in the candidate's copy
    (the worker runs it under the user's file name), or '' when no frame is in it."""
    lines = [m for m in _FRAME.finditer(str(tb or "")) if Path(m.group(1)).name == candidate.name]
    return f"{candidate}, line {lines[-1].group(2)}: " if lines else ""


def _remeasured_roofline(device: str, record: dict[str, Any] | None,
                         given: dict[str, Any] | None) -> float | None:
    """The roofline from the device's peaks measured now, on as many threads as the ``given``
    peaks were (their name ends in ``-<n>t`` on cpu; the cache keeps the highest): a floor
    from a peak measured on a busy machine is too high, and a runtime under it is the
    measurement's fault before it is the candidate's. None (the floor stands) when measuring
    fails: on a device the task's references nearly fill, the measurement's own buffers may
    not fit."""
    if not record or not given:
        return None
    from assay.bench.device import peaks

    threads = re.search(r"-(\d+)t$", str(given.get("name", "")))
    before = torch.get_num_threads()
    if device == "cpu" and threads:
        torch.set_num_threads(int(threads.group(1)))
    try:
        return roofline_ms(record, peaks(device, refresh=True))
    except (RuntimeError, OSError) as e:  # out of memory included (torch's is a RuntimeError)
        log.warning("roofline: the device's peaks could not be measured again (%s); the "
                    "floor from the given peaks stands", str(e).splitlines()[0][:200])
        return None
    finally:
        torch.set_num_threads(before)


def _judge(v: Verdict, prep: Prepared, w: WorkerRun, cfg: VerifyConfig,
           remeasure: Callable[[], float | None] | None = None) -> None:
    """Record the checks of one finished worker run: how contained it was, then either how it
    failed (timeout, crash, the stage that raised) or every check on its report."""
    result, outcome = w.result, w.outcome
    if getattr(outcome, "isolation", None):
        # Informational (always passes): which isolation layers this machine allowed, and why
        # any was refused, so a verdict says how contained the candidate was.
        checks.record(v, "sandbox", True, outcome.isolation_line())
    if result is None:
        name = "timeout" if outcome.startswith("timeout") else "crash"
        checks.record(v, name, False, outcome)
        v.error = outcome
        return
    if "error" in result:
        stage = result.get("stage")
        name = {"load": "compiles", "construct": "constructs", "report": "crash"}.get(stage, "runs")
        log = result.get("build_log") or ""
        if log:
            name = "compiles"
        error = _in_candidate(result.get("traceback"), w.candidate) + str(result["error"])
        checks.record(v, name, False, error + ("\n" + str(log) if log else ""))
        v.error = error
        return
    try:
        _judge_report(v, prep, w, cfg, remeasure)
    except (_Malformed, KeyError, TypeError, ValueError, IndexError, AttributeError) as e:
        checks.record(v, "crash", False, f"malformed worker report: {type(e).__name__}: {e}")
        v.error = "malformed worker report"


def _judge_report(v: Verdict, prep: Prepared, w: WorkerRun, cfg: VerifyConfig,
                  remeasure: Callable[[], float | None] | None = None) -> None:
    """A worker that ran the protocol to the end: every check on its report, in verdict order.
    A missing or mistyped field raises (``_judge`` records a malformed report)."""
    result = w.result
    checks.record(v, "compiles", True)
    checks.record(v, "constructs", True)
    checks.record(v, "runs", True)
    _check_parameters(v, result)
    found = _compare_outputs(prep, w, cfg)
    v.max_abs_err, v.rel_err = found.max_abs, found.rel
    _check_outputs(v, found, prep.reductions)
    _check_timing(v, result, found.unsettled)
    _check_integrity(v, result, w.tampered_inputs)
    _check_speed(v, cfg, remeasure)
    if cfg.audit:  # the audit covered every timed call (assay.verify.worker.CallAudit)
        _check_audit_present(v, result, prep)
    if "kernels" in result:
        calls = (result.get("audit") or {}).get("calls") or []
        _check_kernels(v, result["kernels"], prep, cfg, w.own_kernels,
                       [c["rows"] for c in calls])
        if w.sampled is not None:  # (cpu) what the kernel saw against what the report says
            _check_observer(v, w.sampled, calls)
            own_dirs = (str(kernel_cache(w.scratch)[0]), str(w.scratch))
            checks.record(v, "timing_observed", *observer.timing_disagreement(
                result["timing"], calls, w.sampled, own_dirs))
        if prep.device.startswith("cuda") and cfg.policy == "strict":
            _check_provenance(v, result, w)


def _check_audit_present(v: Verdict, result: dict[str, Any], prep: Prepared) -> None:
    """``audit_consistency`` and, where the report lost them, ``kernel_audit``: the job asked
    for the audit, and an honest worker always returns it (or an error, judged elsewhere), so
    a report without the audit or without the kernel rows of its timed calls was cut by the
    candidate on its way out."""
    audit = result.get("audit")
    if not isinstance(audit, dict):
        checks.record(v, "audit_consistency", False, "the worker's report carries no audit, "
                      "though the job asked for one: the report was rewritten")
        return
    if checks.record(v, "audit_consistency", *policy_mod.audit_consistency(audit, prep.device)) \
            and not isinstance(result.get("kernels"), list):
        checks.record(v, "kernel_audit", False, "the audit's timed calls reached the report "
                      "without their kernel rows: the report was rewritten")


def _check_parameters(v: Verdict, result: dict[str, Any]) -> None:
    """``parameters``: ModelNew's parameters have the reference's names and shapes, so the
    harness could load the reference's (secret, randomized) weights into it."""
    params = result["parameters"]
    checks.record(v, "parameters", bool(result["parameters_loaded"]),
            "" if result["parameters_loaded"] else
            f"ModelNew's parameters {params['candidate']} do not match the reference's "
            f"{params['reference']}: the harness cannot load the reference's weights")


@dataclass
class _OutputFindings:
    """What the comparison of every reported call found, before it becomes checks."""

    problems: dict[str, list[str]] = field(default_factory=lambda: {
        "check": [], "stale": [], "timed": [], "after": []})  # per phase of the protocol
    layout: list[str] = field(default_factory=list)      # wrong device, shape, dtype, strides
    lazy: list[str] = field(default_factory=list)        # not a plain tensor with storage
    unsettled: list[str] = field(default_factory=list)   # changed after forward returned
    aliased: list[str] = field(default_factory=list)     # shares memory with an input
    changed: list[str] = field(default_factory=list)     # inputs modified in place
    outside: list[str] = field(default_factory=list)     # canaries around an input changed
    precision: list[str] = field(default_factory=list)   # over the float64 error bound
    # the correctness sets' closest call to that bound (ratio, its detail): said on a pass too
    nearest_bound: tuple[float, str] = (0.0, "")
    # every compared call's error against float64, per output and input distribution, and the
    # largest off-grid ratio (compare.rounded_inputs): said on a pass too
    set_errors: list[SetError] = field(default_factory=list)
    off_grid: str = ""
    max_abs: float = 0.0  # over the correctness sets
    rel: float = 0.0


_STALE_LABELS = {"stale_new_data": "new data at the same pointers",
                 "stale_repeat": "the same call repeated",
                 "stale_new_ptr": "earlier data at new pointers"}


def _call_label(prep: Prepared, slot: str, phase: str, s: int) -> str:
    """Where in the protocol a call was, for the verdict's details."""
    if phase == "check":
        return f"input set {s} ({prep.distributions[s]})"
    if phase == "stale":
        return f"{_STALE_LABELS.get(slot, slot)} (set {s})"
    if phase == "timed":
        fresh = "a fresh set" if s not in prep.check_sets else "a correctness set's data"
        return f"timed call with {fresh} (set {s})"
    return f"timing buffer after timing (set {s})"


def _compare_outputs(prep: Prepared, w: WorkerRun, cfg: VerifyConfig) -> _OutputFindings:
    """Every call of the protocol (``plan_slots``): each output's metadata as the worker
    reported it against the reference's, then its landed values against the expected ones."""
    calls = w.result["calls"]
    if not isinstance(calls, dict):
        raise _Malformed("calls is not an object")
    found = _OutputFindings()
    dev_type = prep.device.split(":")[0]
    slots = plan_slots(prep.check_sets, prep.timing_sets, prep.swap_sets, cfg.min_runs)
    if prep.placement == "recompute":  # each set's references made once: its calls together
        slots = sorted(slots, key=lambda slot: slot[2])
    for slot, phase, s in slots:
        where = _call_label(prep, slot, phase, s)
        problems = found.problems[phase]
        call = calls.get(slot)
        if not isinstance(call, dict):
            problems.append(f"{where}: no result reported")
            continue
        refs = prep.refs[s]
        outs = call["outputs"]
        if len(outs) != len(refs):
            problems.append(f"{where}: {len(outs)} outputs, reference has {len(refs)}")
        if phase in ("check", "stale") and any(call.get("inputs_changed") or []):
            found.changed.append(where)
        if call.get("outside_writes"):  # every call: pads are never refilled
            found.outside.append(f"{where}: {', '.join(map(str, call['outside_writes'][:3]))}")
        for j, (m, r) in enumerate(zip(outs, refs)):
            tag = f"{where} output {j}"
            if not m.get("plain"):
                found.lazy.append(f"{tag} is a {m.get('type')}, not a plain torch.Tensor with "
                                  f"storage")
                problems.append(f"{tag}: not a plain tensor, not compared")
                continue
            bad = _layout_mismatches(m, r, dev_type, prep.device,
                                     prep.out_meta[j][2] if j < len(prep.out_meta) else None)
            if not m["settled"]:
                found.unsettled.append(tag)
            if m["aliases"] and not prep.reference_aliases:
                found.aliased.append(tag)
            if bad:
                found.layout += [f"{tag}: {b}" for b in bad]
                problems += [f"{tag}: {b}" for b in bad]
                continue
            if w.compared is not None:  # one landing buffer: compared during the run
                done = w.compared.get(slot) or []
                c = done[j] if m["written"] and j < len(done) else None
            elif m["written"] and slot in w.landing and j < len(w.landing[slot]):
                c = compare_tensor(w.landing[slot][j].to(r.device), r, prep.refs64[s][j],
                                   prep.stats[s][j], cfg, prep.reduction, device=prep.device)
            else:
                c = None
            if c is None:
                problems.append(f"{tag}: not returned" + (
                    " (not handed over in the protocol's order)"
                    if w.compared is not None and m["written"] else ""))
                continue
            if c.err_rel >= 0:
                found.set_errors.append(SetError(j, prep.distributions[s], c.err_rel, c.own_rel,
                                                 unit_roundoff(r.dtype, cfg), tag))
            if phase == "check":
                found.max_abs, found.rel = max(found.max_abs, c.max_abs), max(found.rel, c.rel)
                if not c.precision_ok:
                    found.precision.append(f"{tag}: {c.precision_detail}")
                elif c.precision_ratio > found.nearest_bound[0]:
                    found.nearest_bound = (c.precision_ratio, f"{tag}: {c.precision_detail}")
            if not c.ok:
                problems.append(f"{tag}: {c.detail}")
    # Every call counts, the timed ones with float64 references too: a kernel that rounds its
    # inputs only when timed meets data off the grid there (the swapped sets).
    rounded, found.off_grid = rounded_inputs(found.set_errors)
    found.precision += rounded
    return found


def _layout_mismatches(m: dict[str, Any], r: torch.Tensor, dev_type: str,
                       device: str, returned: tuple | None = None) -> list[str]:
    """How a reported output's device, shape, dtype and strides differ from the reference's
    (dtype and strides are compared only where the shape matches). The strides may be those
    of the reference's kept copy or those the reference's forward returned (``returned``):
    a view that is not dense, such as ``states[:, -1]`` of an einsum's result, is kept as a
    contiguous copy (KernelBench's Mamba2ReturnFinalState run as its own candidate was
    rejected on an H200 for returning its own reference's layout)."""
    bad = []
    if str(m["device"]).split(":")[0] != dev_type:
        bad.append(f"on {m['device']}, expected {device}")
    want_dtype = str(r.dtype).removeprefix("torch.")
    if tuple(m["shape"]) != tuple(r.shape):
        bad.append(f"shape {tuple(m['shape'])} != reference {tuple(r.shape)}")
    elif m["dtype"] != want_dtype:
        bad.append(f"dtype {m['dtype']} != reference {want_dtype}")
    elif not strides_accepted(r.shape, m["stride"], (r.stride(), returned or r.stride())):
        bad.append(f"strides {tuple(m['stride'])} != reference {tuple(r.stride())}")
    return bad


def strides_accepted(shape, stride, reference_strides) -> bool:
    """Whether an output of ``shape`` with ``stride`` has a layout the task allows: one of the
    reference's (its kept copy's, what its forward returned), or the contiguous one. Which dense
    order a library returns is its run-time choice: on an H100, SDPA's memory-efficient backend
    returns (batch, seq, heads, dim) memory order where its math backend, and every other GPU's
    choice, returns contiguous (KernelBench's L1_97), so a contiguous output is always as good
    as the reference's. Strides of dims of size 1 address nothing and are not compared."""
    def same(a, b) -> bool:
        return len(a) == len(b) == len(shape) and all(
            n == 1 or x == y for n, x, y in zip(shape, a, b))

    return any(same(stride, ref) for ref in reference_strides) or same(
        stride, contiguous_strides(shape))


def contiguous_strides(shape) -> tuple[int, ...]:
    """The row-major strides of ``shape`` (elements)."""
    out, step = [], 1
    for n in reversed(tuple(shape)):
        out.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(out))


# The memory plan's steps (assay.verify.memory.Protocol.reductions) each check lost a part to.
_LIGHTER = {"correctness": ("check",), "stale_results": ("check",),
            "timed_outputs": ("float64", "timing", "swap")}


def _lighter(name: str, reductions: dict[str, str], detail: str) -> str:
    """``detail``, followed by what the memory plan left out of check ``name``."""
    lost = [reductions[k] for k in _LIGHTER.get(name, ()) if k in reductions]
    if not lost:
        return detail
    return "; ".join(([detail] if detail else [])
                     + ["lighter protocol (memory plan): " + "; ".join(lost)])


def _check_outputs(v: Verdict, found: _OutputFindings,
                   reductions: dict[str, str] | None = None) -> None:
    """The output checks: layout, lazy outputs, correctness, precision, stale results, inputs
    unchanged, writes in bounds, no aliasing, and the timed calls' outputs. ``reductions``:
    what the memory plan left out of the protocol, named in the details of the checks that
    lost it."""
    problems, changed, aliased = found.problems, found.changed, found.aliased
    red = reductions or {}
    checks.record(v, "output_layout", not found.layout, "; ".join(found.layout[:4]))
    checks.record(v, "lazy_output", not found.lazy, "; ".join(found.lazy[:3]))
    checks.record(v, "correctness", not problems["check"],
                  _lighter("correctness", red, "; ".join(problems["check"][:4])))
    checks.record(v, "precision", not found.precision, "; ".join(found.precision[:3]) or
            "candidate within the allowed error against float64" + (
                f" (closest, {found.nearest_bound[0]:.2f} of the bound: "
                f"{found.nearest_bound[1]})" if found.nearest_bound[1] else "")
            + (f"; {found.off_grid}" if found.off_grid else ""))
    checks.record(v, "stale_results", not problems["stale"],
                  _lighter("stale_results", red, "; ".join(problems["stale"][:3])))
    checks.record(v, "inputs_unchanged", not changed,
            f"inputs modified in place: {', '.join(changed[:4])}" if changed else "")
    checks.record(v, "writes_in_bounds", not found.outside,
                  "canary pads around inputs changed (writes outside the tensors the candidate "
                  f"was given): {'; '.join(found.outside[:3])}" if found.outside else "")
    checks.record(v, "no_output_aliasing", not aliased,
            f"output shares memory with an input: {', '.join(aliased[:3])}" if aliased else "")
    timed = problems["timed"] + problems["after"]
    checks.record(v, "timed_outputs", not timed, _lighter("timed_outputs", red,
                                                           "; ".join(timed[:3])))


def _check_timing(v: Verdict, result: dict[str, Any], unsettled: list[str]) -> None:
    """The runtime the worker measured, and ``stream_ordered``: no output changed after forward
    returned and no significant device work ran outside the timed region."""
    t = result["timing"]
    v.runtime_ms, v.runtime_iqr_ms = float(t["median_ms"]), float(t["iqr_ms"])
    escaped, floor, where = _escaped_ms(result, v.runtime_ms)
    late = escaped > max(0.25 * v.runtime_ms, floor)
    detail = []
    if unsettled:
        detail.append(f"outputs changed after forward returned (work left running on a thread "
                      f"or side stream): {', '.join(unsettled[:3])}")
    if late:
        detail.append(f"{escaped:.4g} ms of device work {where}, outside the "
                      f"{v.runtime_ms:.4g} ms timed on the caller's stream")
    unjoined = [c for c in (result.get("audit") or {}).get("calls") or []
                if c.get("side") and not c.get("joins")]
    if unjoined:
        detail.append(f"{len(unjoined)} timed call(s) ran kernels on a stream other than the "
                      f"caller's without a stream wait in the call (never ordered after the "
                      f"caller's inputs nor joined back before its end event)")
    checks.record(v, "stream_ordered", not detail, "; ".join(detail))


# The floor under which escaped device work is noise: from the audit's trace (CUPTI kernel
# timestamps against the timing events), a couple of microseconds; from sync latency, 10 us
# (the host's wake-up jitter).
TRACE_FLOOR_MS, SYNC_FLOOR_MS = 0.002, 0.01


def _escaped_ms(result: dict[str, Any], runtime_ms: float) -> tuple[float, float, str]:
    """Device work per timed call that the timed region did not hold, the floor under which
    that is noise, and how it was seen.

    Where the audit traced every timed call on cuda: a call's device work over every stream
    spans from its first kernel's start to its last kernel's end; whatever of that span exceeds
    the time the caller's stream measured ran outside the timed region (during the hold before
    the call, or after its end event), median over the timed calls; plus kernels a thread of
    the candidate's launched between calls. Otherwise from the timing loop: how much later a
    device-wide sync ended than the caller's stream (a host-latency estimate; the profiler's
    own callbacks inflate it, so the trace wins where there is one)."""
    audit = result.get("audit") or {}
    calls = [c for c in audit.get("calls") or [] if "span_us" in c]
    if calls:
        spans = sorted(float(c["span_us"]) for c in calls)
        beyond = max(0.0, spans[len(spans) // 2] / 1e3 - runtime_ms)
        between = float(audit.get("outside_us", 0.0)) / 1e3 / max(1, int(audit["expected"]))
        return beyond + between, TRACE_FLOOR_MS, (
            "in the audit's trace beyond the caller's timed region (a call's span over every "
            "stream, and kernels launched between calls)")
    return float(result["timing"].get("escaped_ms", 0.0)), SYNC_FLOOR_MS, \
        "finished only after a device-wide sync"


def _check_integrity(v: Verdict, result: dict[str, Any], tampered_inputs: bool) -> None:
    """``harness_integrity`` (nothing of the worker's harness side replaced, the shared input
    arena intact) and ``global_state`` (no process-wide setting changed). Every worker that
    finishes writes both lists: a report without them was cut (a malformed report)."""
    tampered, changes = result["tampered"], result["settings_changes"]
    if not isinstance(tampered, list) or not isinstance(changes, list):
        raise _Malformed("tampered or settings_changes is not a list")
    tampered = list(tampered)
    if tampered_inputs:
        tampered.append("the shared input arena file")
    checks.record(v, "harness_integrity", not tampered,
            f"replaced: {', '.join(tampered[:12])}" if tampered else "")
    checks.record(v, "global_state", not changes, "; ".join(changes[:6]))


def _check_speed(v: Verdict, cfg: VerifyConfig,
                 remeasure: Callable[[], float | None] | None = None) -> None:
    """The speedups over the baselines, and ``roofline`` where the task has a floor: a runtime
    under the roofline is impossible, so something was skipped or faked. The floor is never
    above the fastest baseline, and before a runtime is called impossible, ``remeasure`` (the
    device's peaks measured now) may lower it."""
    if v.baseline_eager_ms:
        v.speedup_eager = v.baseline_eager_ms / v.runtime_ms if v.runtime_ms > 0 else None
    if v.baseline_compile_ms:
        v.speedup_compile = v.baseline_compile_ms / v.runtime_ms if v.runtime_ms > 0 else None
    # The reference's own baselines ran this fast on this machine: a floor above the fastest of
    # them was computed from peaks measured low (on a busy machine), not from what the task
    # needs. (The campaign's device step, measured while other jobs ran, put MeanDim's floor at
    # 0.92 ms where eager ran in 0.55 and an honest kernel in 0.51.)
    shown = [t for t in (v.baseline_eager_ms, v.baseline_compile_ms) if t and t > 0]
    if v.roofline_ms and shown and min(shown) < v.roofline_ms:
        v.roofline_ms = min(shown)
    if v.roofline_ms and remeasure is not None \
            and v.runtime_ms < cfg.roofline_margin * v.roofline_ms:
        fresh = remeasure()
        if fresh is not None and fresh < v.roofline_ms:
            v.roofline_ms = fresh
    if v.roofline_ms:
        floor = cfg.roofline_margin * v.roofline_ms
        checks.record(v, "roofline", v.runtime_ms >= floor,
                f"runtime {v.runtime_ms:.4g} ms is under the roofline floor "
                f"{v.roofline_ms:.4g} ms: impossible, so something was skipped or faked"
                if v.runtime_ms < floor else "")


def _check_kernels(v: Verdict, rows: list, prep: Prepared, cfg: VerifyConfig,
                   own: frozenset[str] = frozenset(), calls: list | None = None) -> None:
    """The profiled kernels against the policy (``kernel_audit``; ``own``: the candidate's
    @triton.jit kernels; ``calls``: each timed call's rows) and, where the config asks,
    against the reference's own ops (``reference_fallback``)."""
    audit = policy_mod.audit(rows, prep.device, cfg.policy, cfg.max_library_time_frac, own,
                             calls)
    v.kernels_launched = audit.kernels
    v.kernel_profile = policy_mod.profile_rows(rows, prep.device)
    v.library_time_frac = audit.library_time_frac
    checks.record(v, "kernel_audit", audit.ok, audit.detail)
    if cfg.reject_reference_ops:
        ok, detail = policy_mod.reference_fallback(rows, prep.reference_ops)
        checks.record(v, "reference_fallback", ok, detail)


def _check_observer(v: Verdict, sampled: observer.Sampled, calls: list) -> None:
    """``kernel_audit`` against the out-of-process observer: the timed calls' wall time the
    samples place in torch's libraries may not exceed the report's ATen share (its calls'
    upper quartile) by more than observer.MARGIN.
    The policy's verdict and detail stay; the observer's detail is added to it."""
    ok, detail = observer.disagreement(sampled, calls)
    before = v.checks["kernel_audit"]
    checks.record(v, "kernel_audit", bool(before["passed"]) and ok,
                  "; ".join(x for x in (before["detail"], detail) if x))


def _check_provenance(v: Verdict, result: dict[str, Any], w: WorkerRun) -> None:
    """``audit_provenance``: every kernel the report credits to the candidate is defined in a
    library built for it, read here from disk (the report itself can be forged)."""
    own = getattr(w, "own_kernels", frozenset())
    names = provenance.credited(result["kernels"], lambda n: policy_mod.is_library(n, own))
    libs = result.get("libraries") or []
    if not isinstance(libs, list):
        raise _Malformed("libraries is not a list")
    files = provenance.artifacts(w.scratch, kernel_cache(w.scratch)[0], libs)
    checks.record(v, "audit_provenance", *provenance.proven(names, files))
