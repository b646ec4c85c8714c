"""Reference preparation, once per (task, device) and reused across candidates: secret input
sets drawn from fresh seeds, the reference model with randomized weights, its expected outputs
in the task's dtype and in float64, their statistics, the reference's own ops, aliasing and
longest reduction, and whether the task is degenerate (:func:`prepare`, :class:`Prepared`)."""

from __future__ import annotations

import contextlib
import copy
import gc
import math
import os
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from assay.tasks.instantiate import (DrawnSets, as_outputs, digest, draws_alike, init_inputs,
                                     make_inputs, reference_model, set_fp32_numerics)
from assay.tasks.model import Task
from assay.verify import policy as policy_mod
from assay.verify.arenas import FileArena, Layout, describe_inputs, fill_inputs
from assay.verify.compare import compare_tensor, is_inexact, reference_stats, wide_dtype
from assay.verify.quiet import no_kineto_markers
from assay.verify.memory import Plan, Protocol, TooLarge, check_distributions, plan_task
from assay.verify.settings import VerifyConfig
from assay.verify.worker import moved


def resolve_device(device: str) -> str:
    if device in ("auto", "", None):
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def reduction_length(model, inputs: list) -> tuple[list[torch.Tensor], int, list[tuple]]:
    """Run the reference once and estimate the longest reduction behind one output element:
    the inner dimension of matmuls, the fan-in of convolutions, the normalized size of norms
    and softmaxes, in/out element ratios of reductions. A TorchFunctionMode (cheap: no dynamo).
    Returns the outputs (cloned), that length, and the outputs' strides as the model returned
    them (a clone of a view that is not dense, such as ``states[:, -1]``, is contiguous)."""
    from torch.overrides import TorchFunctionMode

    longest = [1]

    def numel(x) -> int:
        return x.numel() if isinstance(x, torch.Tensor) else 1

    class Count(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            try:
                name = getattr(func, "__name__", "")
                ts = [a for a in args if isinstance(a, torch.Tensor)]
                k = 1
                if name in ("matmul", "mm", "bmm", "mv", "dot", "vdot", "inner", "__matmul__",
                            "__rmatmul__", "einsum", "tensordot", "chain_matmul") and ts:
                    k = ts[0].shape[-1] if ts[0].dim() else 1
                elif name in ("addmm", "baddbmm", "addbmm", "addmv", "addr") and len(ts) > 1:
                    k = ts[1].shape[-1] if ts[1].dim() else 1
                elif name in ("linear", "bilinear") and len(ts) > 1:
                    k = ts[1].shape[-1]
                elif name.startswith("conv") and len(ts) > 1 and ts[1].dim() > 2:
                    w = ts[1]
                    fan = w.shape[0] if "transpose" in name else w.shape[1]
                    k = fan * math.prod(w.shape[2:])
                elif name == "scaled_dot_product_attention" and len(ts) > 1:
                    k = max(ts[0].shape[-1], ts[1].shape[-2])  # q.k over dims, p.v over keys
                elif name in ("softmax", "log_softmax", "_softmax", "logsumexp", "cumsum",
                              "cumprod", "_log_softmax") and ts:
                    d = args[1] if len(args) > 1 else kwargs.get("dim", -1)
                    k = ts[0].shape[d] if ts[0].dim() else 1
                elif name in ("layer_norm", "rms_norm") and ts:
                    shp = args[1] if len(args) > 1 else kwargs.get("normalized_shape", ())
                    k = math.prod(shp if isinstance(shp, (list, tuple)) else [shp])
                elif name in ("batch_norm", "group_norm", "instance_norm") and ts:
                    k = max(ts[0].numel() // max(ts[0].shape[1] if ts[0].dim() > 1 else 1, 1), 1)
                elif ts and isinstance(out, torch.Tensor) and 0 < numel(out) < numel(ts[0]):
                    k = numel(ts[0]) // numel(out)
                longest[0] = max(longest[0], int(k))
            except Exception:  # noqa: BLE001 - an estimate; never fails the reference
                pass
            return out

    with torch.no_grad(), Count():
        raw = as_outputs(model(*inputs))
        strides = [tuple(o.stride()) for o in raw]
        outs = [o.detach().clone() for o in raw]
    del raw
    n_in = sum(x.numel() for x in inputs if isinstance(x, torch.Tensor))
    n_out = sum(o.numel() for o in outs)
    ratio = n_in // n_out if n_out and n_in > n_out else 1
    return outs, max(longest[0], ratio, 1), strides



class Recomputed:
    """The references of every input set, made again when asked (the memory plan's placement
    ``recompute``, where keeping them does not fit the device): a set's outputs in the task's
    dtype and, for the sets that have one, in float64, from the reference kept on the device;
    the last set asked for is kept. :meth:`view` gives the per-set sequences ``Prepared.refs``
    and ``Prepared.refs64`` are elsewhere."""

    def __init__(self, run_ref: Callable[[list], list], run_ref64: Callable[[list, list], list],
                 sets: list[list], wide: set[int]):
        self._run, self._run64, self._sets, self._wide = run_ref, run_ref64, sets, wide
        self._last: tuple[int, list, list] | None = None
        self.seconds = 0.0

    def outputs(self, s: int) -> tuple[list, list]:
        if self._last is None or self._last[0] != s:
            self._last = None  # freed before the next set's are made
            t = time.perf_counter()
            xs = self._sets[s]
            if not isinstance(self._sets, DrawnSets):  # (a draw is a fresh copy already)
                xs = [x.clone() if isinstance(x, torch.Tensor) else x for x in xs]
            r = self._run(xs)  # on copies: a forward that writes its inputs changes no set
            r64 = self._run64(xs, r) if s in self._wide else [None] * len(r)
            self._last = (s, r, r64)
            self.seconds += time.perf_counter() - t
        return self._last[1], self._last[2]

    def forget(self) -> None:
        """Drop the set kept (made again when next asked for)."""
        self._last = None

    def view(self, which: int) -> "_RecomputedView":
        return _RecomputedView(self, which)


class _RecomputedView(Sequence):
    """``refs[s]`` (which 0) or ``refs64[s]`` (which 1) of a :class:`Recomputed`."""

    def __init__(self, rec: Recomputed, which: int):
        self._rec, self._which = rec, which

    def __len__(self) -> int:
        return len(self._rec._sets)

    def __getitem__(self, s: int) -> list:
        if not 0 <= s < len(self):
            raise IndexError(s)  # (also where iteration ends)
        return self._rec.outputs(s)[self._which]


@dataclass
class Prepared:
    """Everything the harness computed for one (task, device): reused across candidates."""

    task: Task
    device: str
    init_inputs: list
    init_seed: int
    state_dict: dict
    sets: Sequence[list]             # every input set, on ``placement`` (drawn: DrawnSets)
    distributions: list[str]         # the distribution each set was drawn from
    check_sets: list[int]            # correctness sets (cfg.input_distributions)
    timing_sets: list[int]
    swap_sets: list[int]             # sets swapped into timed calls (else a correctness set)
    # task-dtype reference outputs per set, on ``placement``; float64 ones (None where not
    # computable). Under placement "recompute", sequences that make a set's when asked.
    refs: Sequence[list[torch.Tensor]]
    refs64: Sequence[list[torch.Tensor | None]]
    stats: list[list[dict[str, float]]]
    reference_ops: list[str]         # ATen compute ops of the reference's forward
    reference_aliases: bool          # the reference's output shares memory with an input
    reduction: int                   # the longest reduction behind one output element
    degenerate: str                  # why the outputs barely depend on the inputs ("" if not)
    poison_bytes: int
    prepare_s: float = 0.0
    placement: str = ""              # where sets and references live: the device, or "cpu";
    # "recompute": the sets on the device, the references made again when compared
    reductions: dict[str, str] = field(default_factory=dict)  # the memory plan's lighter protocol
    one_landing: bool = False        # one landing buffer for every verified call (handshake)
    transfer: str = "host"           # draw, host or cuda_ipc (the plan's choice; the worker's)
    seeds: list[int] = field(default_factory=list)     # each set's (secret) seed
    digests: list[list] = field(default_factory=list)  # each drawn set's input digests
    # (shape, dtype, strides as the forward returned them) of each output, the same every set
    out_meta: list[tuple] = field(default_factory=list)
    _inputs: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def references(self) -> list[list[torch.Tensor]]:
        return [self.refs[i] for i in self.check_sets]

    def host_inputs(self) -> dict[str, Any]:
        """The input arena (a shared-memory file, written once, mapped copy-on-write by every
        worker) and the descriptors of what is in it. Rebuilt if a worker tampered with it."""
        if self._inputs is not None and self._inputs["identity"] != self._inputs["arena"].identity():
            self._inputs["arena"].close()
            self._inputs = None
        if self._inputs is None:
            layout = Layout("in")
            descs = describe_inputs(self, layout)
            arena = FileArena(layout.size, "assay-inputs-")
            fill_inputs(arena.buf, self, descs)
            self._inputs = {"arena": arena, "descs": descs, "identity": arena.identity()}
        return self._inputs

    def release_transients(self) -> None:
        """Give back what preparing and comparing left in this process's device cache before a
        worker runs: the worker is another process, and memory the caching allocator keeps
        here is memory it cannot have (the plan counts the preparation's transients as
        reusable). On an H200, KernelBench's 6 GiB elementwise tasks ran the worker out of
        memory with 105 GiB held by their harness this way. Recomputed references are dropped
        too (made again when compared)."""
        for refs in (self.refs, self.refs64):
            if isinstance(refs, _RecomputedView):
                refs._rec.forget()
        if self.device.startswith("cuda") and torch.cuda.is_available():
            gc.collect()
            torch.cuda.empty_cache()

    def inputs_tampered(self) -> bool:
        return self._inputs is not None and \
            self._inputs["identity"] != self._inputs["arena"].identity()



def _profile_ops(model, inputs: list) -> list[str]:
    try:  # the autograd profiler's front end: torch.profiler.profile imports dynamo (seconds)
        with no_kineto_markers(), torch.no_grad(), \
                torch.autograd.profiler.profile(use_kineto=True) as prof:
            model(*inputs)
        rows = [{"name": e.key} for e in prof.key_averages()]
        return sorted(policy_mod.compute_ops(rows))
    except Exception:  # noqa: BLE001 - no op list: the reference_fallback check passes
        return []


def _overlaps(outs: list[torch.Tensor], inputs: list) -> bool:
    def rng(t):
        s = t.untyped_storage()
        return s.data_ptr(), s.data_ptr() + s.nbytes()
    for o in outs:
        if o.numel() == 0:
            continue
        lo, hi = rng(o)
        for x in inputs:
            if isinstance(x, torch.Tensor) and x.numel() and x.device == o.device:
                a, b = rng(x)
                if lo < b and a < hi:
                    return True
    return False


def _degenerate(refs: list[list[torch.Tensor]], refs64: list, stats: list, dists: list[str],
                check: list[int], cfg: VerifyConfig, device: str) -> str:
    """The harness's own degeneracy test, on what it computed anyway: if the expected outputs
    of every correctness set (different inputs, different distributions) pass the comparison
    against one another, a candidate that ignores its inputs would pass too."""
    a = check[0]
    others = [b for b in check if b != a]
    # set a's references in both precisions taken once (recomputed references make a set
    # again whenever another was asked for last: the memory plan counts a's and one more)
    refs_a, refs64_a = refs[a], refs64[a]
    if not others or not all(is_inexact(r) for r in refs_a):
        return ""
    for b in others:
        for j, (ra, rb) in enumerate(zip(refs_a, refs[b])):
            if ra.shape != rb.shape:
                return ""
            if not compare_tensor(rb, ra, refs64_a[j], stats[a][j], cfg, device=device).ok:
                return ""
    return (f"the expected outputs of {len(check)} input sets ({', '.join(dists[i] for i in check)}) "
            f"match one another within the tolerances: the output barely depends on the inputs, "
            f"so an input-ignoring constant would pass")


def compact(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a storage of its own size (a copy where it is a view of a larger one): a kept
    reference that views a buffer keeps all of it (smooth_l1_loss's float64 mean is a 0-dim
    view of its 8 GiB elementwise loss: KernelBench's L1_96 harness kept eight of them, 64 GiB,
    while its worker ran)."""
    if t.numel() and t.untyped_storage().nbytes() > t.numel() * t.element_size():
        return t.clone()
    return t


def unsplit_large_blocks() -> None:
    """Let this process's CUDA caching allocator split no cached block of 256 MB or more.
    Otherwise a reference kept for the whole verification is carved out of a freed input set's
    segment, and that whole segment stays reserved: an H200 harness of KernelBench's L1_46 kept
    24 GiB of references in 60 GiB of segments while its worker ran, and the worker ran out of
    memory. Large requests then get segments of their own size (freed by ``empty_cache`` when
    their tensors go). Left alone where ``PYTORCH_CUDA_ALLOC_CONF`` sets the split size or
    expandable segments (the user's choice)."""
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if "max_split_size_mb" in conf or "expandable_segments" in conf:
        return
    setting = "max_split_size_mb:256"
    set_conf = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    with contextlib.suppress(Exception):  # an allocator without the option: splits as before
        if set_conf is not None:
            set_conf(setting)
        else:
            torch.cuda.memory._set_allocator_settings(setting)


def _to(values: list, device: str) -> list:
    # (references kept on the host: KernelBench's 6 GiB outputs go through the pinned stage)
    return [moved(v, device) if isinstance(v, torch.Tensor) else v for v in values]


def borrowed_error(stats: list[dict[str, float]], rms: float, top: float) -> dict[str, float]:
    """For a set without a float64 reference: the task-dtype reference's own error, estimated
    from the correctness sets' (``stats``: theirs) as the largest relative error among them
    times this set's RMS (``err_rms_est``, read by :func:`compare_tensor`), and its worst
    element's as the largest relative one times this set's largest magnitude ``top``
    (``err_max_est``)."""
    rel = [st["err_rms"] / st["rms64"] for st in stats
           if st.get("rms64", 0.0) > 0 and "err_rms" in st]
    out = {"err_rms_est": max(rel) * rms} if rel else {}
    worst = [st["err_max"] / st["max64"] for st in stats
             if st.get("max64", 0.0) > 0 and "err_max" in st]
    if worst:
        out["err_max_est"] = max(worst) * top
    return out


def prepare(task: Task, device: str, cfg: VerifyConfig, plan: Plan | None = None) -> Prepared:
    """Draw secret seeds, build the reference and compute the expected outputs (task dtype and
    float64) on ``device``, one input set at a time. The memory plan (made here unless given)
    says where the sets and references are kept: on the device, or on the host when the device
    cannot hold them (compared on the device a chunk at a time), and which protocol fits: the
    config's, or a lighter one (fewer sets; float64 references for the correctness sets only,
    the other sets compared with the reference error the correctness sets measured). Raises
    :class:`TooLarge`, before anything of the task's size is allocated, when nothing fits."""
    t0 = time.perf_counter()
    set_fp32_numerics(cfg.allow_tf32)  # the reference in true fp32 unless the config says tf32
    device = resolve_device(device)
    if device.startswith("cuda") and torch.cuda.is_available():
        # What an earlier task left cached goes back first: kept references made inside its
        # larger segments would pin them (a self-check's harness held ~74 GiB for L1_46 right
        # after L1_45's 16 GB sets, where its plan counted ~35)
        gc.collect()
        torch.cuda.empty_cache()
        unsplit_large_blocks()

    def protocol_of(p: Plan | None) -> Protocol:
        """The plan's protocol (the config's where the shapes could not be found)."""
        if p is not None and not p.fits:
            raise TooLarge(p)
        return p.protocol if p is not None and p.protocol is not None else Protocol.of(cfg)

    plan = plan or plan_task(task, device, cfg)
    proto = protocol_of(plan)
    module = task.module()
    if proto.transfer == "draw" and not draws_alike(module, device):
        # sets that do not draw the same twice must be kept and copied: planned again so
        plan = plan_task(task, device, cfg, exclude=("draw",))
        proto = protocol_of(plan)
        if proto.transfer == "draw":  # (unplanned: the config's transfer)
            proto = replace(proto, transfer="host")
    keep = "cpu" if plan is not None and plan.placement == "host" else device
    recompute = plan is not None and plan.placement == "recompute"
    # draw: no set is kept; each is drawn again from its seed where it is needed (here by
    # recompute and the arenas of a fallback, in the worker by every call)
    drawn = proto.transfer == "draw"
    init_seed = secrets.randbits(31)
    model = reference_model(module, init_seed, device)
    sd = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    seeds: list[int] = []
    digests: list[list] = []

    def draw(distribution: str) -> list:  # (sampled on the device where it can be)
        seeds.append(secrets.randbits(31))
        xs = make_inputs(module, seeds[-1], device, distribution)
        # before any forward: a reference that writes its inputs changes no digest
        digests.append([digest(x) for x in xs] if drawn else [])
        return xs

    check_dists = check_distributions(cfg.input_distributions, proto.check_sets)
    n = len(check_dists)
    # Timing buffers hold the task's own data; the sets swapped into timed calls cycle through
    # the correctness distributions after the first (large, offset where configured), so a
    # kernel that cheats only when it thinks it is timed meets the data its checks used.
    others = check_dists[1:] or check_dists
    swap_dists = [others[i % len(others)] for i in range(proto.swap_sets)]
    dists = check_dists + ["native"] * proto.timing_sets + swap_dists
    check = list(range(n))
    timing_ids = list(range(n, n + proto.timing_sets))
    # Without sets of their own (a lighter protocol, or swap_sets 0), the second correctness
    # set's data is swapped into a timed call: a cache keyed on pointers still shows there.
    swap_ids = list(range(n + proto.timing_sets, len(dists))) or check[1:2] or check[:1]

    def run_ref(inputs: list) -> list[torch.Tensor]:
        with torch.no_grad():
            return [o.detach().clone() for o in as_outputs(model(*inputs))]

    try:
        model64 = copy.deepcopy(model).to(torch.float64)
    except Exception:  # noqa: BLE001
        model64 = None

    def run_ref64(inputs: list, want: list[torch.Tensor]) -> list[torch.Tensor | None]:
        if model64 is None:
            return [None] * len(want)
        xs = [x.to(wide_dtype(x.dtype)) if isinstance(x, torch.Tensor) and is_inexact(x) else x
              for x in inputs]
        try:
            with torch.no_grad():
                outs = as_outputs(model64(*xs))
        except Exception:  # noqa: BLE001 - some ops have no float64 kernel: no fp64 reference
            return [None] * len(want)
        if len(outs) != len(want):
            return [None] * len(want)
        return [compact(o.detach().to(wide_dtype(w.dtype)))
                if is_inexact(w) and o.shape == w.shape else None for o, w in zip(outs, want)]

    # One set at a time: its inputs, outputs and float64 outputs are made on the device, their
    # statistics taken there, and then they go where the plan keeps them.
    sets, refs, refs64, stats = [], [], [], []
    for i, dist in enumerate(dists):
        xs = draw(dist)
        if i == 0:
            r, reduction, ref_strides = reduction_length(model, xs)
            with torch.no_grad():
                ref_alias = _overlaps(as_outputs(model(*xs)), xs)
            # the reference's op list serves reference_fallback alone (the self-check has it off)
            ops = _profile_ops(model, xs) if cfg.reject_reference_ops else []
        else:
            r = run_ref(xs)
        if proto.wide_all or i < n:
            r64 = run_ref64(xs, r)
            stats.append([reference_stats(a, b) for a, b in zip(r, r64)])
        else:  # a lighter protocol: this set's float64 reference is never made
            r64 = [None] * len(r)
            stats.append([])
            for j, a in enumerate(r):
                st = reference_stats(a, None)
                if st:
                    st.update(borrowed_error([stats[c][j] for c in check
                                              if dists[c] == dist] or
                                             [stats[c][j] for c in check], st["rms"],
                                             st["max"]))
                stats[-1].append(st)
        if i == 0:
            out_meta = [(tuple(o.shape), o.dtype, st) for o, st in zip(r, ref_strides)]
            out_bytes = sum(o.numel() * o.element_size() for o in r)
        if not drawn:
            sets.append(_to(xs, keep))
        refs.append(None if recompute else _to(r, keep))
        refs64.append(None if recompute else _to(r64, keep))
        del xs, r, r64
    if drawn:
        sets = DrawnSets(module, seeds, dists, device, digests)
    if recompute:  # nothing of the references kept: made again, a set at a time, when compared
        rec = Recomputed(run_ref, run_ref64, sets,
                         {i for i in range(len(dists)) if proto.wide_all or i < n})
        refs, refs64 = rec.view(0), rec.view(1)
    else:
        del model64
    prep = Prepared(task, device, init_inputs(module), init_seed, sd, sets, dists, check,
                    timing_ids, swap_ids, refs, refs64, stats, ops, ref_alias, reduction,
                    _degenerate(refs, refs64, stats, dists, check, cfg, device),
                    max(out_bytes, 1 << 20), placement="recompute" if recompute else keep,
                    reductions=dict(plan.reductions) if plan is not None else {},
                    one_landing=proto.one_landing, out_meta=out_meta,
                    transfer=proto.transfer if device.startswith("cuda") or drawn else "host",
                    seeds=seeds, digests=digests)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    prep.prepare_s = time.perf_counter() - t0
    return prep
