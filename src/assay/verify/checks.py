"""The registry of verifier checks: the one place a check's name and meaning are written.

The harness records checks only through :func:`record` (an unknown name raises: a programming
error, never a verdict), the archive's dataset card describes them from here, and a test keeps
the README's table ("What the verifier checks") equal to this registry, row for row. A failed
check's name is the verdict's rejection reason, so these names are also the values of
``Verdict.reasons``. Pure data: no torch, importable by any step.
"""

from __future__ import annotations

from dataclasses import dataclass

from assay.records import Verdict

TARGETS = ("cpu", "cuda")
POLICIES = ("strict", "permissive")


@dataclass(frozen=True)
class Check:
    """One named check of a verdict."""

    name: str
    rejects: str  # what a failure means: the README table's text (markdown)
    targets: tuple[str, ...] = TARGETS  # devices it is recorded on
    policies: tuple[str, ...] = POLICIES  # verify policies it is recorded under
    informational: bool = False  # recorded as passed, never rejects: it says how, not whether
    when: str = ""  # the condition for being recorded at all ("" = every verdict that gets there)


# In verdict order: the stages a worker fails at, then the checks of a complete report.
REGISTRY: dict[str, Check] = {c.name: c for c in (
    Check("task_not_degenerate", "any candidate for a task whose output barely depends on its "
          "inputs (`verify.on_degenerate: reject`)",
          when="the task is degenerate (its degeneracy record or the harness's own test says so)"),
    Check("too_large", "not the candidate: the task at this size does not fit in this "
          "machine's memory, even with the lightest protocol (input sets, references in the "
          "task's dtype and float64, the worker's buffers and arenas, planned from the shapes "
          "before anything is allocated), or its file arenas find no room in shared memory "
          "or the temp folder; the detail names the bytes needed and free",
          when="the memory plan finds no placement that fits, even with the lightest protocol; "
               "a file arena's pages cannot be reserved"),
    Check("memory_plan", "never rejects: the memory plan could not hold the configured "
          "protocol and verified with the lightest-weighing lighter one that fits, the fewest "
          "steps first (float64 references for "
          "the correctness sets only, one landing buffer reused by every call, fewer timing "
          "buffers, fewer swapped sets, fewer "
          "correctness sets, never under two); lists every step taken, and each check that "
          "lost a part says so in its detail", informational=True,
          when="the memory plan chose a lighter protocol than the config's"),
    Check("sandbox", "never rejects: records which isolation layers (pid/network/mount "
          "namespaces, unprivileged uid, cgroup memory and pids, rlimits) the machine allowed, "
          "and why any was refused", informational=True),
    Check("compiles", "build errors (the compiler log is kept for repair prompts); before "
          "anything runs, a file that does not parse, defines no `ModelNew` or imports a module "
          "that is not installed"),
    Check("constructs", "a ModelNew that raises when constructed with the task's arguments"),
    Check("runs", "a forward that raises an exception"),
    Check("crash", "a worker that dies (segfault, illegal address, out of memory) or leaves an "
          "unreadable or malformed report"),
    Check("timeout", "a worker that outlives `verify.timeout_s`"),
    Check("parameters", "a ModelNew whose parameters cannot take the reference's weights"),
    Check("output_layout", "wrong shape (also one that would broadcast), dtype or strides "
          "(those of the reference or contiguous ones)"),
    Check("lazy_output", "an output that is not a plain tensor with its values in memory (a "
          "tensor subclass or a wrapper that computes when compared)"),
    Check("correctness", "values outside per-dtype tolerances on any input set, against a "
          "float64 reference (at most a millionth of a large output's elements may be off by "
          "rounding at the scale of its largest values, or of the task-dtype reference's own "
          "worst element); NaN anywhere the reference has none "
          "(allocator memory is poisoned with NaN before each call, so unwritten outputs show)"),
    Check("precision", "compute in a lower precision than the task's dtype (bf16/fp16 inside an "
          "fp32 task, approximate math): the error is measured against float64 and must stay "
          "within what the dtype's own rounding explains; an output whose error on the off-grid "
          "sets is over 32x the most on the task's own data was computed from rounded inputs, "
          "however long the reduction (the float64 bound grows with it, the error of rounded "
          "inputs does not). Every call with a float64 reference counts, timed ones too"),
    Check("stale_results", "results cached across calls (keyed on pointers, ids, a call "
          "counter): fresh inputs in the same buffers must give fresh outputs"),
    Check("inputs_unchanged", "a candidate that modifies its inputs"),
    Check("writes_in_bounds", "writes outside the tensors the candidate was given "
          "(pygpubench's canaries): every input sits between 64 KiB pads of a secret NaN word, "
          "checked after every verified call (a timed call's stray write shows at its buffer's "
          "next one); what lies past an output the candidate allocates is the allocator's, "
          "unguarded"),
    Check("no_output_aliasing", "an output that is an input's memory"),
    Check("timed_outputs", "outputs of timed calls are re-checked, including calls after the "
          "input buffers were overwritten in place (same pointers, new data)"),
    Check("stream_ordered", "device work outside the timed region (on another stream, or "
          "launched by a background thread between calls), kernels on another stream with no "
          "stream wait in the call, or outputs still changing after forward returned (hidden "
          "from the timer)"),
    Check("harness_integrity", "replaced clocks, sync functions, events or comparison "
          "functions"),
    Check("global_state", "changed process-wide settings (TF32, cuDNN flags, denormal flushing, "
          "thread counts, default dtype)"),
    Check("roofline", "a runtime below `max(bytes / bandwidth, FLOPs / peak)` of the measured "
          "device (FLOPs of ops no algorithm does with less: convolutions left out, Winograd "
          "and FFT do fewer; never above the fastest baseline: peaks measured on a busy "
          "machine are low)",
          when="the task has FLOPs/bytes and the device has measured peaks"),
    Check("audit_consistency", "a candidate that runs another implementation when it thinks "
          "it is audited (asks torch whether a profiler runs, reads its caller's stack, counts "
          "calls, times the gaps between them): timed calls that ran different ATen ops or "
          "kernels (on cuda, at most 1% of the calls may each lack one device-kernel record of "
          "the others' and differ in nothing else: records the device trace dropped), a trace "
          "that lost calls (the profiler stopped), on cuda verified timed "
          "calls whose device time differs from the others' by over 2x; a worker report "
          "without the audit the job asked for (cut on its way out)",
          when="`verify.audit` is on"),
    Check("kernel_audit", "under `strict`, any ATen compute op or library kernel (cuBLAS, "
          "cuDNN, ATen's, torch.compile's Triton kernels, any call of torch.compile's code) in "
          "the timed calls, from Python, from C++ or from a thread of its own; under "
          "`permissive`, library time above `max_library_time_frac` (on cpu, the median of "
          "the timed calls' shares: host time, which one preempted call would sway); on cuda, a "
          "call that runs no kernel of its own; on cpu, a report whose ATen share of the timed "
          "calls (their upper quartile) is more than 0.35 under the share of their wall time "
          "the harness's own samples place in torch's libraries (`verify/observer.py`: "
          "`perf_event_open` on the worker's threads, from outside its process). The profiler "
          "runs over every call from before "
          "the candidate loads, so what is audited is what is timed", when="`verify.audit` is on"),
    Check("timing_observed", "on cpu, a timing the worker's report cannot back: its median is "
          "not the one its own per-call times give (recomputed by the harness), a timed call "
          "is reported shorter than its call window (the audit's clock inside the call), or "
          "the candidate's own code (files outside the interpreter's, the import path's and the "
          "system's folders, or code in no mapping the harness saw though the kernel recorded "
          "every one) ran between the timed calls, as the harness's own samples of the "
          "worker's threads see it (`verify/observer.py`): work moved out of the windows timed",
          when="`verify.audit` is on, on the cpu target"),
    Check("audit_provenance", "a kernel audit that credits the candidate with a kernel no "
          "library built for it defines: the harness reads the candidate's libraries and "
          "cubins (kernel cache, scratch folder) itself, so a worker report rewritten by the "
          "candidate cannot name a kernel it never built, nor pass a library kernel the "
          "policy's patterns miss (a cub or cuDNN name) as its own", targets=("cuda",),
          policies=("strict",), when="`verify.audit` is on and the timed calls ran kernels"),
    Check("reference_fallback", "a candidate that runs the reference's own ops (a try/except "
          "fallback, or the task's module called again)", when="`verify.audit` and "
          "`verify.reject_reference_ops` are on"),
)}
NAMES = tuple(REGISTRY)


class CheckError(Exception):
    """A check recorded wrongly (a name not in the registry, a failed informational check): a
    programming error in the harness. Not a KeyError or ValueError, which the harness reads as
    a malformed worker report."""


def get(name: str) -> Check:
    """The registered check ``name``; raises :class:`CheckError` for any other name."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise CheckError(f"{name!r} is not a registered verifier check "
                         f"(assay.verify.checks.REGISTRY)") from None


def record(v: Verdict, name: str, passed: bool, detail: str = "") -> bool:
    """Record check ``name`` in the verdict (an informational check must pass); returns
    ``passed``. The harness's only way to add a check."""
    check = get(name)
    if check.informational and not passed:
        raise CheckError(f"{name} is informational: it never fails")
    return v.check(name, passed, detail)
