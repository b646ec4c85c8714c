"""Peak memory of one verification, planned from the task's sizes before anything big exists.

KernelBench tasks at their own sizes hold gigabytes per tensor (level 1's LogSoftmax: a 6.4 GB
input), and the verifier keeps several input sets, their references in the task's dtype and in
float64, the candidate's worker with its own copies, and a landing arena for every verified
call. This module answers, from shapes alone, whether that fits, and where the references go:

- shapes come from a pass on the ``meta`` device (the task's module, ``get_inputs()`` under a
  meta default device, and a forward that allocates nothing); a forward's own peak of
  intermediates is tracked on the way. Nothing of the task's size is allocated here.
- :func:`plan` counts every buffer of the harness and the worker for each placement of the
  references (``device``; else, on cuda, ``recompute``: the input sets on the device and each
  set's references computed again when its outputs are compared, nothing of them kept; else
  ``host``, compared on the device a chunk at a time). Host references of KernelBench's
  largest tasks went through pageable memory at about 1.3 GB/s by the phase times (54-79 s
  of preparation and 63-91 s of comparison per task on an H200), where recomputing a set
  costs two forwards. Where a placement does not fit, lighter protocols are planned (the
  steps of :func:`lighter_protocols`: float64 references for the correctness sets only, one
  landing buffer reused by every verified call, fewer timing buffers, fewer swapped sets,
  fewer correctness sets, never under two, in any combination); the plan that fits with the
  fewest steps wins and
  the plan lists every step taken (``Plan.reductions``: the verdict's ``memory_plan`` check
  and the checks that lost a part say so). Only when the lightest protocol does not fit is the
  plan's ``fits`` False, and :meth:`Plan.too_large_detail` says by how much (the verdict
  ``too_large``).

Pure arithmetic apart from :func:`task_shapes` and :func:`free_memory`: unit tests feed fake
free-memory numbers.
"""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# Device memory no tensor gets: the CUDA context and cuBLAS/cuDNN workspaces of one process.
CUDA_CONTEXT_B = 768 << 20
# Host memory of one process with torch imported (the harness and the worker: two of them).
PROCESS_B = 512 << 20
# Bytes of canary before and after every input tensor the worker gives the candidate
# (worker.Canaries, pygpubench's canaries): a write up to this far outside an input lands in
# them. 64 KiB keeps the data as aligned as its buffer (the caching allocator's 512 B, the
# host allocator's 64 B).
CANARY_PAD_B = 64 << 10
# The caching allocator rounds and fragments; plans keep this share of free memory unused.
HEADROOM = 0.10
# The worker's L2 flush buffer on cuda (2 x the L2; H100/H200: 50 MB L2) and on cpu.
FLUSH_B = {"cuda": 2 * (64 << 20), "cpu": 64 << 20}
# Elements per chunk of every comparison (verify/compare.py): bounded temporaries whatever the
# output's size, and references on the host are compared on the device a chunk at a time.
COMPARE_CHUNK = 1 << 26
# Wide temporaries of one chunk's comparison: value, reference, float64 reference, difference,
# bound (and masks).
COMPARE_TEMPS = 5


def gib(nbytes: float) -> str:
    return f"{nbytes / (1 << 30):.1f} GiB"


@dataclass(frozen=True)
class TaskShapes:
    """What the plan needs of a task: bytes per input set, per output set, of the parameters,
    and of the forward's intermediates (peak live), each also as if computed in float64."""

    inputs_b: int
    inputs64_b: int
    outputs_b: int
    outputs64_b: int
    outputs_numel: int
    params_b: int
    params64_b: int
    forward_peak_b: int      # live intermediates of one forward (outputs included)
    forward64_peak_b: int
    source: str = "meta"     # how the shapes were found: meta | cpu
    input_tensors: int = 1   # tensors per input set (each between canary pads in the worker)


def _hi_itemsize(dtype) -> int:
    import torch

    if dtype.is_complex:
        return 16
    if dtype.is_floating_point:
        return 8
    return torch.empty((), dtype=dtype).element_size()


def _bytes(t, hi: bool = False) -> int:
    return t.numel() * (_hi_itemsize(t.dtype) if hi else t.element_size())


def _tensors(values) -> list:
    import torch

    return [v for v in values if isinstance(v, torch.Tensor)]


class _PeakTracker:
    """A torch-function mode that tracks the bytes of live op results (views and in-place
    results excluded): the forward's peak of intermediates, at the task's dtype and in float64.
    A function mode, not a dispatch mode: a dispatch mode imports dynamo (seconds)."""

    def __init__(self):
        self.live = [0, 0]
        self.peak = [0, 0]

    def mode(self):
        import torch
        from torch.overrides import TorchFunctionMode
        from torch.utils._pytree import tree_leaves

        tracker = self

        class Mode(TorchFunctionMode):
            def __torch_function__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                seen = {id(a) for a in tree_leaves((args, kwargs)) if isinstance(a, torch.Tensor)}
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and id(t) not in seen and t._base is None:
                        tracker._add(t)
                return out

        return Mode()

    def _add(self, t) -> None:
        sizes = (_bytes(t), _bytes(t, hi=True))
        for i, n in enumerate(sizes):
            self.live[i] += n
            self.peak[i] = max(self.peak[i], self.live[i])
        weakref.finalize(t, self._free, sizes)

    def _free(self, sizes) -> None:
        for i, n in enumerate(sizes):
            self.live[i] -= n


def task_shapes(module: Any) -> TaskShapes:
    """The task's sizes from one pass on the meta device (no data allocated). Raises what the
    task raises when some op has no meta kernel; :func:`shapes_or_none` is the forgiving form."""
    import torch

    from assay.tasks.instantiate import as_outputs, init_inputs, value_list

    with torch.device("meta"), torch.no_grad():
        model = module.Model(*init_inputs(module))
        values = value_list(module.get_inputs(), "get_inputs()")
        inputs = _tensors(values)
        tracker = _PeakTracker()
        with tracker.mode():
            outs = as_outputs(model(*values))
        state = list(model.state_dict().values())
    return TaskShapes(
        inputs_b=sum(_bytes(x) for x in inputs),
        inputs64_b=sum(_bytes(x, hi=True) for x in inputs),
        outputs_b=sum(_bytes(o) for o in outs),
        outputs64_b=sum(_bytes(o, hi=True) for o in outs),
        outputs_numel=sum(o.numel() for o in outs),
        params_b=sum(_bytes(p) for p in state),
        params64_b=sum(_bytes(p, hi=True) for p in state),
        forward_peak_b=max(tracker.peak[0], sum(_bytes(o) for o in outs)),
        forward64_peak_b=max(tracker.peak[1], sum(_bytes(o, hi=True) for o in outs)),
        input_tensors=len(inputs))


def shapes_or_none(module: Any) -> tuple[TaskShapes | None, str]:
    """:func:`task_shapes`, or None and why (an op without a meta kernel, a task that reads
    data): the caller then verifies without a plan, as before planning existed."""
    try:
        return task_shapes(module), ""
    except Exception as e:  # noqa: BLE001 - task code; no plan is not an error
        return None, f"{type(e).__name__}: {str(e)[:200]}"


# The protocol's verified calls, shared by the worker (which makes them) and the harness
# (which compares them); here, with no torch, so that planning memory imports none.
def plan_slots(check: list[int], timing_ids: list[int], swaps: list[int],
               min_runs: int) -> list[tuple[str, str, int]]:
    """(slot name, phase, input set) of every verified call, in the order the worker makes them.

    Phases: ``check`` (correctness), ``stale`` (staleness protocol), ``timed`` (a timed call
    that got an independent set), ``after`` (each timing buffer after timing).
    """
    # Set a is the last one checked: set b's data goes into the buffers of the call just made,
    # where a cache keyed on the last input pointer (a C++ static, say) replays that output.
    a, b = check[-1], check[0]
    slots = [(f"check{i}", "check", s) for i, s in enumerate(check)]
    slots += [("stale_new_data", "stale", b),   # set b's data into set a's buffers
              ("stale_repeat", "stale", b),     # the same call again
              ("stale_new_ptr", "stale", a)]    # set a's data again, at new pointers
    slots += [(f"timed{k}", "timed", s) for k, s in enumerate(swaps[:max(min_runs, 0)])]
    slots += [(f"after{i}", "after", s) for i, s in enumerate(timing_ids)]
    return slots


@dataclass(frozen=True)
class Protocol:
    """How many of each buffer one verification holds: the verify config's protocol, or a
    lighter one the plan chose to fit memory (:func:`lighter_protocols`)."""

    check_sets: int    # correctness sets (the staleness protocol needs two)
    timing_sets: int   # timing buffers the timed calls rotate over
    swap_sets: int     # independent verified sets swapped into timed calls
    min_runs: int = 10
    transfer: str = "host"  # host | cuda_ipc
    wide_all: bool = True   # float64 references for every set (else the correctness sets only)
    one_landing: bool = False  # one landing buffer reused by every verified call

    @classmethod
    def of(cls, cfg) -> "Protocol":
        return cls(len(cfg.input_distributions), cfg.timing_sets, cfg.swap_sets, cfg.min_runs,
                   str(cfg.transfer))

    @property
    def sets(self) -> int:
        return self.check_sets + self.timing_sets + self.swap_sets

    @property
    def wide_sets(self) -> int:
        """Sets with a float64 reference."""
        return self.sets if self.wide_all else self.check_sets

    @property
    def slots(self) -> int:
        """Verified calls, each with a landing buffer for its outputs."""
        c, t = self.check_sets, self.timing_sets
        swaps = list(range(c + t, self.sets)) or [0]  # else a correctness set (prepare)
        return len(plan_slots(list(range(c)), list(range(c, c + t)), swaps, self.min_runs))

    def reductions(self, full: "Protocol") -> dict[str, str]:
        """What this protocol leaves out of ``full``: {step: one line for the verdict}, steps
        ``float64``, ``timing``, ``swap``, ``check`` (the checks that lose a part say so)."""
        out = {}
        if full.wide_all and not self.wide_all:
            out["float64"] = (f"float64 references for the {self.check_sets} correctness sets only "
                       f"(timed and after-timing calls compared against the task-dtype "
                              f"reference, with the reference error measured on a correctness "
                              f"set)")
        if self.one_landing and not full.one_landing:
            out["landing"] = ("one landing buffer reused by every verified call (each call's "
                              "outputs compared while the worker waits)")
        if self.timing_sets < full.timing_sets:
            out["timing"] = (f"{self.timing_sets} timing buffer(s) instead of "
                             f"{full.timing_sets}" + (" (the timed calls perturb one buffer)"
                                                      if self.timing_sets == 1 else ""))
        if self.swap_sets < full.swap_sets:
            out["swap"] = (f"{self.swap_sets} independent sets swapped into timed calls "
                           f"instead of {full.swap_sets}"
                           + (" (a correctness set's data is swapped into a timed call "
                              "instead: a cache keyed on pointers still shows, one keyed on "
                              "content replays a right answer)" if self.swap_sets == 0
                              else ""))
        if self.check_sets < full.check_sets:
            out["check"] = f"{self.check_sets} correctness sets instead of {full.check_sets}"
        return out


MIN_CHECK_SETS = 2  # the staleness protocol puts one set's data into another's buffers


def _no_float64(p: Protocol) -> Protocol | None:
    return replace(p, wide_all=False) if p.wide_all and p.sets > p.check_sets else None


def _one_landing(p: Protocol) -> Protocol | None:
    return replace(p, one_landing=True) if not p.one_landing and p.slots > 1 else None


def _fewer_timing(p: Protocol) -> Protocol | None:
    return replace(p, timing_sets=p.timing_sets - 1) if p.timing_sets > 1 else None


def _fewer_swaps(p: Protocol) -> Protocol | None:
    return replace(p, swap_sets=p.swap_sets - 1) if p.swap_sets > 0 else None


def _fewer_checks(p: Protocol) -> Protocol | None:
    return replace(p, check_sets=p.check_sets - 1) if p.check_sets > MIN_CHECK_SETS else None


# The steps of a lighter protocol, in the order they are taken, each as often as it applies.
STEPS = (_no_float64, _one_landing, _fewer_timing, _fewer_swaps, _fewer_checks)
STEP_NAMES = ("float64", "landing", "timing", "swap", "check")  # as Protocol.reductions


def lighter_lattice(full: Protocol) -> list[Protocol]:
    """Every protocol the steps reach from ``full``, any of them as often as it applies
    (``full`` first; at most 2 x 2 x 3 x 3 x 2 with the default protocol)."""
    seen, todo = [full], [full]
    while todo:
        p = todo.pop(0)
        for step in STEPS:
            q = step(p)
            if q is not None and q not in seen:
                seen.append(q)
                todo.append(q)
    return seen


def _lightness(p: Protocol, full: Protocol) -> tuple:
    """How much lighter than ``full``: the steps taken, then how far each went, then which
    (a later step of STEPS weighs more)."""
    names = p.reductions(full)
    depth = (int(p.wide_all != full.wide_all) + int(p.one_landing != full.one_landing)
             + full.timing_sets - p.timing_sets + full.swap_sets - p.swap_sets
             + full.check_sets - p.check_sets)
    return len(names), depth, tuple(n in names for n in reversed(STEP_NAMES))


def lighter_protocols(full: Protocol) -> list[Protocol]:
    """``full``, then each step lighter than the one before, in the order :func:`plan` tries
    them: float64 references for the correctness sets only; one landing buffer reused by
    every verified call; fewer timing buffers (down to one); fewer swapped sets (down to none); fewer correctness sets (down to two). Each keeps
    every earlier step: the list ends with the lightest protocol the verifier runs."""
    out = [full]
    for step in STEPS:
        while (q := step(out[-1])) is not None:
            out.append(q)
    return out


def check_distributions(distributions: list, n: int) -> list:
    """The first ``n`` correctness distributions to keep when a lighter protocol drops sets:
    repeated distributions go first (the last repeat first), so the kinds of data stay."""
    keep = list(distributions)
    while len(keep) > max(n, 0):
        repeats = [i for i, d in enumerate(keep) if d in keep[:i]]
        keep.pop(repeats[-1] if repeats else len(keep) - 1)
    return keep


@dataclass
class Plan:
    """Bytes each side needs for one placement of the references, and whether they fit."""

    placement: str                       # device | recompute | host (where refs and sets live)
    device: str
    device_need_b: int
    host_need_b: int
    device_free_b: int | None
    host_free_b: int | None
    parts: dict[str, int] = field(default_factory=dict)  # named buffers, for the report
    protocol: Protocol | None = None     # the protocol these bytes are for
    reductions: dict[str, str] = field(default_factory=dict)  # lighter than the config's
    # file arenas (shared memory, else the temp folder: :func:`arena_room`) and their room
    arena_need_b: int = 0
    arena_free_b: int | None = None

    @property
    def fits(self) -> bool:
        """Each need within the free memory less the allocator's headroom, and the file arenas
        within the room of the file system they go to."""
        ok_dev = self.device_free_b is None or self.device_need_b <= _usable(self.device_free_b)
        ok_host = self.host_free_b is None or self.host_need_b <= _usable(self.host_free_b)
        ok_files = self.arena_free_b is None or self.arena_need_b <= _usable(self.arena_free_b)
        return ok_dev and ok_host and ok_files

    def too_large_detail(self) -> str:
        short = []
        if self.device == "cuda" and self.device_free_b is not None \
                and self.device_need_b > _usable(self.device_free_b):
            short.append(f"{gib(self.device_need_b)} of GPU memory where {gib(self.device_free_b)}"
                         f" is free")
        if self.host_free_b is not None and self.host_need_b > _usable(self.host_free_b):
            short.append(f"{gib(self.host_need_b)} of host memory where {gib(self.host_free_b)} "
                         f"is available")
        if self.arena_free_b is not None and self.arena_need_b > _usable(self.arena_free_b):
            short.append(f"{gib(self.arena_need_b)} of file arenas where shared memory or the "
                         f"temp folder has {gib(self.arena_free_b)}")
        big = sorted(self.parts.items(), key=lambda kv: -kv[1])[:4]
        lightest = (f"; even with the lightest protocol: {'; '.join(self.reductions.values())}"
                    if self.reductions else "")
        return (f"verifying this task needs {' and '.join(short)} ({HEADROOM:.0%} of it kept "
                f"free for the allocator; references on the "
                f"{self.placement}; largest parts: "
                + ", ".join(f"{k} {gib(v)}" for k, v in big) + lightest + ")")

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "fits": self.fits}


class TooLarge(Exception):
    """The task cannot be verified in this machine's memory; the message says by how much."""

    def __init__(self, plan: Plan):
        super().__init__(plan.too_large_detail())
        self.plan = plan


def _usable(free: int) -> int:
    return int(free * (1 - HEADROOM))


def sets_stay_on_host(device_type: str, transfer: str) -> bool:
    """On a GPU with the inputs in a host arena (``transfer: host``) the worker's sets stay on
    the host (``worker.host_view``) and each call's inputs are copied to the device as they are
    made: the device holds the calls' inputs, not every set besides (KernelBench's 7 GiB norms:
    21 GiB less, on an 80 GB card the difference between a verdict and ``too_large``). The
    worker and the memory plan (:func:`plan_for`) both ask this."""
    return device_type == "cuda" and transfer == "host"


def sets_resident(device_type: str, transfer: str) -> bool:
    """Whether the worker holds every input set on its device for the whole run: not with
    ``transfer: draw`` (each set drawn from its seed when a call needs it,
    ``instantiate.DrawnSets``) nor where they stay on the host (:func:`sets_stay_on_host`); a
    call then has one more copy of its inputs (the pristine one its inputs are checked
    against, or the device copy the perturbed timing buffers are made from)."""
    return transfer != "draw" and not sets_stay_on_host(device_type, transfer)


def plan_for(shapes: TaskShapes, proto: Protocol, device: str, placement: str,
             device_free_b: int | None, host_free_b: int | None,
             arena_free_b: int | None = None) -> Plan:
    """Bytes of one verification with the harness's sets and references on ``placement``.

    Harness: parameters; per set its inputs (none with ``transfer: draw``), outputs and
    float64 outputs (made one set at a time, so preparation's transient is one set's forward
    in both precisions); the input arena (every set, or the parameters alone where drawn) and
    the landing arena for every verified call. Worker (runs while the harness holds all that):
    every input set materialized (drawn, or on cuda with a host arena: a set's copy for the
    pristine check instead, :func:`sets_resident`), the correctness clones, the timing
    buffers, a forward, the NaN poisoning of the allocator (an output's size, twice over), the
    cache-flush buffer. Comparison: the wide temporaries of one chunk (recompute: one set's
    references made again as well; the degeneracy test, in preparation, holds one more set's).
    """
    s = shapes
    cuda = device == "cuda"
    recompute = placement == "recompute"
    # draw: no side keeps an input set; each draws one when it needs it (the harness's
    # recompute draws the set it compares)
    drawn = proto.transfer == "draw"
    kept_sets = 0 if drawn else proto.sets * s.inputs_b
    fwd = s.forward_peak_b
    fwd64 = s.params64_b + s.inputs64_b + s.forward64_peak_b
    refs = kept_sets + proto.sets * s.outputs_b + proto.wide_sets * s.outputs64_b
    chunk_b = min(s.outputs_numel, COMPARE_CHUNK) * 16  # complex128 at most
    temps = COMPARE_TEMPS * chunk_b
    # device placement: the landing output is copied to the device whole, then compared
    compare = temps + (s.outputs_b if placement != "host" else 0)
    prepare = s.inputs_b + fwd + fwd64 + 2 * chunk_b  # one set, both precisions, its stats
    if recompute:
        # a set's references made again from its drawn inputs: the task-dtype forward, then
        # (its outputs held) the float64 one, then both compared a chunk at a time
        one_set = s.inputs_b + max(fwd, s.outputs_b + max(fwd64, s.outputs64_b + temps))
        compare = one_set + (s.outputs_b if placement != "host" else 0)
        # the harness's degeneracy test (preparation, before any worker) holds the first
        # correctness set's references in both precisions while another set's are made
        prepare = max(prepare, s.outputs_b + s.outputs64_b + one_set)
        refs = kept_sets  # the input sets alone are kept (none where drawn)

    # sets not resident in the worker (drawn, or kept in a host arena): a call's pristine
    # inputs are one more set on the device, and so are the perturbed timing buffers' sources
    apart = not sets_resident(device, proto.transfer)
    worker_sets = 0 if apart else proto.sets * s.inputs_b
    # a draw holds the set and one temporary (a distribution's scaled copy); a swapped timed
    # call's set is drawn beside the timing buffers and their sources (an H200 worker ran out
    # of memory at 67 GiB of L1_21's draw where the count without these said 48)
    drawing = s.inputs_b if drawn else 0
    worker_call = (s.params_b + (proto.check_sets + 1 + apart) * s.inputs_b + drawing + fwd
                   + s.outputs_b)
    worker_timing = (s.params_b + proto.timing_sets * (1 + apart) * s.inputs_b + 2 * drawing
                     + 2 * fwd + FLUSH_B[device])
    # and one more of its largest tensors: the caching allocator splits the poisoning's freed
    # blocks between outputs and snapshots, and a later request of another size finds them
    # taken (an H200 worker ran out of memory at its plan's 78 GiB, asking for 6 more)
    worker = worker_sets + max(worker_call, worker_timing) + max(s.inputs_b, s.outputs_b)
    # every input the candidate gets sits between canary pads (worker.Canaries): the checked
    # sets are held together, then the timing buffers
    worker += (max(proto.check_sets + 1, proto.timing_sets) * s.input_tensors
               * 2 * CANARY_PAD_B)
    landing = (1 if proto.one_landing else proto.slots) * s.outputs_b
    in_arena = kept_sets + s.params_b

    parts = {"input sets (harness)": kept_sets,
             "references": 0 if recompute else proto.sets * s.outputs_b,
             "float64 references": 0 if recompute else proto.wide_sets * s.outputs64_b,
             "worker": worker, "landing arena": landing, "input arena": in_arena,
             "preparation transient": prepare, "comparison transient": compare}
    # recompute keeps the reference model in both precisions on the device
    held_dev = s.params_b + (refs if placement != "host" else 0) + \
        (s.params64_b if recompute else 0)
    if cuda:
        ipc = in_arena + landing if proto.transfer != "host" else 0  # (draw: device arenas)
        # one landing buffer: each call is compared while the worker holds its memory
        during = compare if proto.one_landing else 0
        device_need = max(held_dev + prepare,
                          held_dev + ipc + worker + CUDA_CONTEXT_B + during,
                          held_dev + compare) + CUDA_CONTEXT_B
        files = 0 if proto.transfer != "host" else in_arena + landing
        host_need = 2 * PROCESS_B + s.params_b + (refs if placement == "host" else 0) + files
        return Plan(placement, device, device_need, host_need, device_free_b, host_free_b,
                    parts, proto, arena_need_b=files, arena_free_b=arena_free_b)
    # cpu: one memory holds the harness, both arenas and the worker's private copies.
    during = compare if proto.one_landing else 0
    host_need = (2 * PROCESS_B + s.params_b + refs + in_arena + landing
                 + max(prepare, worker + during, compare))
    return Plan("host", device, host_need, host_need, None, host_free_b, parts, proto,
                arena_need_b=in_arena + landing, arena_free_b=arena_free_b)


def _shortfall(p: Plan) -> int:
    """Bytes over the usable free memory, both sides together (0: it fits)."""
    return sum(max(0, need - _usable(free)) for need, free in
               ((p.device_need_b, p.device_free_b), (p.host_need_b, p.host_free_b),
                (p.arena_need_b, p.arena_free_b))
               if free is not None)


def plan(shapes: TaskShapes, proto: Protocol, device: str, device_free_b: int | None,
         host_free_b: int | None, adapt: bool = True, arena_free_b: int | None = None) -> Plan:
    """The plan that fits with the fewest reductions, the placements in this order on a tie:
    the references on the device, (cuda) recomputed at comparison, on the host. For each
    placement the config's protocol if it fits, else (``adapt``) the lightest-weighing of
    every protocol the steps reach (:func:`lighter_lattice`, :func:`_lightness`) that fits;
    its ``reductions`` list the steps taken. If none fits, the steps of
    :func:`lighter_protocols` one at a time, each kept only when it lowers the bytes that do
    not fit (float64 references on the host: that step does not help a short device), and
    the host placement's plan so reached, whose ``fits`` is False."""
    placements = ["device", "recompute", "host"] if device == "cuda" else ["host"]

    def ladder(where: str) -> Plan:
        def one(p: Protocol) -> Plan:
            x = plan_for(shapes, p, device, where, device_free_b, host_free_b, arena_free_b)
            x.reductions = p.reductions(proto)
            return x

        cur, cur_plan = proto, one(proto)
        if cur_plan.fits or not adapt:
            return cur_plan
        # Every protocol the steps reach: of those that fit, the fewest steps, then the least
        # taken off (two timing buffers before one), then the steps STEPS takes first. (Taken
        # greedily, KernelBench's L1_25 took the one landing buffer, then needed fewer timing
        # buffers and correctness sets too, where fewer timing buffers alone fit.)
        fitting = [x for x in map(one, lighter_lattice(proto)) if x.fits]
        if fitting:
            return min(fitting, key=lambda x: _lightness(x.protocol, proto))
        # none fits: the steps one at a time, each kept where it lowers what is short (what
        # too_large then reports)
        for step in STEPS:
            while not cur_plan.fits and (q := step(cur)) is not None:
                q_plan = one(q)
                if not q_plan.fits and _shortfall(q_plan) >= _shortfall(cur_plan):
                    break  # this step frees nothing that is short: not taken
                cur, cur_plan = q, q_plan
        return cur_plan

    plans = [ladder(where) for where in placements]
    fitting = [p for p in plans if p.fits]
    if fitting:
        return min(fitting, key=lambda p: len(p.reductions))  # min keeps the first of a tie
    return plans[-1]


def free_memory(device: str) -> tuple[int | None, int | None]:
    """(free device bytes, available host bytes) right now; None where unknown. The host's
    bytes are divided by ``ASSAY_HOST_SHARE`` (``assay.env.HOST_SHARE``) where that many runs
    share the host, one per GPU (benchmarks/gpu_phases.sh's self-check shards)."""
    host = None
    try:
        import psutil

        host = int(psutil.virtual_memory().available) // _host_share()
    except Exception:  # noqa: BLE001 - no psutil: the host side is not planned
        pass
    dev = None
    if device.startswith("cuda"):
        import torch

        free, _total = torch.cuda.mem_get_info()
        dev = int(free)
    return dev, host


def _host_share() -> int:
    """How many runs share this host (``ASSAY_HOST_SHARE``, one per GPU), at least one."""
    from assay.env import HOST_SHARE

    try:
        return max(1, int(HOST_SHARE.get()))
    except (TypeError, ValueError):
        return 1


def arena_room() -> int | None:
    """Bytes free where file arenas go (``arenas.folder_room``), divided like
    :func:`free_memory`'s host bytes; None where unknown. Available memory is not that room:
    KernelBench's 72 GB landing arena found no room in an H200 machine's /dev/shm and filled
    its 64 GB disk."""
    from assay.verify.arenas import folder_room

    room = folder_room()
    return None if room is None else room // _host_share()


def plan_transfers(shapes: TaskShapes, cfg, device: str, device_free_b: int | None,
                   host_free_b: int | None, exclude: tuple[str, ...] = (),
                   arena_free_b: int | None = None) -> Plan:
    """:func:`plan` for the config's transfer and the others that apply (on cuda: draw,
    cuda_ipc, host; on cpu: draw, host): the one that fits with the fewest reductions, the
    config's first on a tie, then in that order. Its ``protocol.transfer`` says which the
    worker is to use (a task whose sets fill the GPU keeps its arenas on the host rather than
    lose a check). ``exclude``: transfers not to take (draw, for a task whose sets do not draw
    the same twice)."""
    kind = device.split(":")[0]
    full = Protocol.of(cfg)
    order = ("draw", "cuda_ipc", "host") if kind == "cuda" else ("draw", "host")
    names = [t for t in dict.fromkeys((full.transfer, *order))
             if t in order and t not in exclude] or ["host"]
    plans = [plan(shapes, replace(full, transfer=t), kind, device_free_b, host_free_b,
                  arena_free_b=arena_free_b) for t in names]
    return min(plans, key=lambda p: (not p.fits, len(p.reductions)))  # ties: the first


# The shapes pass's method version: shapes cached by an older ``task_shapes`` are not reused.
# (TaskShapes' field names are in the key too: a new field makes every cached one stale.)
SHAPES_METHOD = 1


def cached_shapes(task) -> tuple[TaskShapes | None, str]:
    """:func:`shapes_or_none` of ``task``, cached per (task file's content, size, torch
    version) beside the task records (``baseline_cache.cache_root``, never writable by a
    candidate): the meta pass imports torch's Python decompositions and dynamo on its first
    op, 2.5 s of a 15 s ``assay verify`` on a 2-core cpu, the same for every candidate."""
    import hashlib
    import json

    import torch

    from assay.bench.baseline_cache import cached_json, cache_root

    fields = sorted(TaskShapes.__dataclass_fields__)
    parts = {"task": task.source_hash, "size": task.size, "torch": torch.__version__,
             "method": SHAPES_METHOD, "fields": fields}
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]

    def compute() -> dict:
        shapes, why = shapes_or_none(task.module())
        return {"cache_key": key, "shapes": None if shapes is None else asdict(shapes),
                "why": why}

    def valid(d) -> bool:
        return isinstance(d, dict) and isinstance(d.get("why"), str) and (
            d.get("shapes") is None
            or isinstance(d["shapes"], dict) and sorted(d["shapes"]) == fields)

    path = cache_root() / f"{task.id}-shapes-{key}.json"
    data, _hit = cached_json(path, compute, False, valid)
    return (None if data["shapes"] is None else TaskShapes(**data["shapes"])), data["why"]


def plan_task(task, device: str, cfg, exclude: tuple[str, ...] = ()) -> Plan | None:
    """The plan of verifying ``task`` on ``device`` now (its free memory), or None when the
    task's shapes cannot be found without running it (verification then goes ahead unplanned);
    :func:`plan_transfers` chooses the transfer."""
    shapes, _why = cached_shapes(task)
    if shapes is None:
        return None
    dev_free, host_free = free_memory(device)
    return plan_transfers(shapes, cfg, device, dev_free, host_free, exclude, arena_room())
