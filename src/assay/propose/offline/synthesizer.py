"""The offline synthesizer as a Proposer: knob spaces and the four evolution operators.

Every candidate of a task comes from one plan (graph.analyze_task) and one knob set; the
operators only move in knob space: translate samples it (the defaults of each template first),
mutate perturbs one or two knobs of a parent, crossover takes each knob from one of the parents,
repair falls back to the defaults (or, if the parent already had them, to the most conservative
set).

A plan that opens with a matrix product has two templates, told apart by the knob ``lib``:
0 = the tiled GEMM of this package with the epilogue fused into its stores (strict policy),
1 = the library's GEMM followed by one fused epilogue kernel (permissive policy). A convolution
has only the library form; float16/bfloat16 products only the tensor-core GEMM. Mutating
``lib`` switches templates: the knobs both share keep their values, the others take the new
template's defaults.
"""

from __future__ import annotations

import ast
import random
import time
from typing import Any

from assay.propose.base import Parent, TaskContext
from assay.propose.offline import codegen
from assay.propose.offline.graph import PREFIX, Analysis, Unsupported, analyze_task
from assay.records import Proposal

TARGETS = ("cpu", "cuda")
POLICIES = ("any", "strict", "permissive")

# The values each knob may take, per (target, template). Every value is valid for every task;
# a kernel checks at run time what it needs (alignment for vectors) and falls back if not.
KNOB_SPACES: dict[tuple[str, str], dict[str, tuple[int, ...]]] = {
    # threads: 0 = OpenMP default, 1 = serial, k = at most k; chunk: elements per OpenMP task;
    # unroll: simd length in units of 4 lanes.
    ("cpu", "elementwise"): {"threads": (0, 1, 2, 4, 8), "chunk": (2048, 8192, 16384, 65536),
                             "unroll": (1, 2, 4, 8)},
    # chunk: rows per OpenMP task (0 = an even static split).
    ("cpu", "row"): {"threads": (0, 1, 2, 4, 8), "chunk": (0, 1, 4, 16),
                     "unroll": (1, 2, 4, 8)},
    # tile_m x tile_n: the output tile of one OpenMP task; k_step: the K slab packed at a time.
    ("cpu", "gemm"): {"threads": (0, 1, 2, 4, 8), "tile_m": (16, 32, 64),
                      "tile_n": (64, 128, 256), "k_step": (64, 128, 256),
                      "unroll": (1, 2, 4, 8)},
    # block: threads per block; vec: floats per load (float4 = 16 bytes); unroll: vectors per
    # thread per grid-stride step; persistent: 1 = a grid capped at a few waves per SM that
    # strides over the data, 0 = one pass with as many blocks as the data needs.
    ("cuda", "elementwise"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4),
                              "unroll": (1, 2, 4), "persistent": (0, 1)},
    # warp_per_row: 1 = a warp per row (short rows), 0 = a block per row; cache_row: 1 = keep
    # the values that several passes use (x, or x + bias) in shared memory (when the row
    # fits); split: blocks per row (a cluster, sm_90+; with a block per row), each with its
    # slice of the columns; regs: when a thread's share of the slice is at most this many
    # vectors, each pass is an unrolled loop (its loads all in flight) and those values stay
    # in registers (0 = a strided loop over the row).
    ("cuda", "row"): {"block": (128, 256, 512, 1024), "vec": (1, 2, 4),
                      "warp_per_row": (0, 1), "cache_row": (0, 1), "split": (1, 2, 4, 8),
                      "regs": (0, 4, 8, 16)},
    # tile_m x tile_n: the block's output tile (256 x 128 of 4 x 4 threads would be 2048
    # threads: 8 x 4 per thread instead); k_step: the K slab in shared memory;
    # thread_m x thread_n: each thread's register tile, in 4 x 4 sub-tiles; load_vec: 4 =
    # float4 global loads and stores, 16-byte cp.async copies (when K and N allow); stages:
    # 2 = double-buffered slabs (the next one loads while the current one is multiplied),
    # 1 = load, sync, multiply; 3, 4 = a ring of that many slabs filled by cp.async (sm_80+).
    # cp_async: 1 = global -> shared copies by cp.async (A, and B^T, stored K-contiguous) into a
    # ring of max(stages, 2) slabs; 0 = through registers (stages 3, 4 use cp.async anyway).
    # On an H200 at 4096^3 (2026-11-24) the cp.async forms ran at 0.76-0.81x of cuBLAS and 256
    # x 128 tiles at 0.87x, against 0.89x for the register-staged default: kept for the search.
    # min_blocks: blocks per SM the register budget must allow (__launch_bounds__; 1 where 2
    # would leave too few registers for the thread's tile, e.g. 256 threads of 8 x 16).
    # warp_tile: 1 = a warp's lanes own a 4 x 8 (or 8 x 4) grid of sub-tiles repeated over the
    # warp's tile (conflict-free float4 reads of shared memory), 0 = each thread's sub-tiles
    # adjacent (bank conflicts for 8- and 16-wide thread tiles).
    ("cuda", "gemm"): {"tile_m": (64, 128, 256), "tile_n": (64, 128), "k_step": (8, 16, 32),
                       "thread_m": (4, 8), "thread_n": (4, 8, 16), "load_vec": (1, 4),
                       "stages": (1, 2, 3, 4), "cp_async": (0, 1), "min_blocks": (1, 2),
                       "warp_tile": (0, 1)},
    # 2-D pooling. cpu: threads over (plane, output row). cuda: block threads; cols: consecutive
    # outputs of a row per thread (their index math shared, one vector store); vec: 1 = input
    # rows as float4 loads of the thread's stride chunk plus its halo (when whole vectors).
    ("cpu", "pool"): {"threads": (0, 1, 2, 4, 8)},
    ("cuda", "pool"): {"block": (128, 256, 512), "cols": (1, 2, 4), "vec": (0, 1)},
    # warp_m x warp_n: each warp's share of the tile, in 16 x 16 WMMA fragments; load_vec: 8 =
    # 16-byte cp.async copies (stages 2 pipelines them), 1 = element loads.
    ("cuda", "gemm_tc"): {"tile_m": (64, 128), "tile_n": (64, 128), "k_step": (32, 64),
                          "warp_m": (32, 64), "warp_n": (32, 64), "load_vec": (1, 8),
                          "stages": (1, 2)},
}


# SMs of the product's device (H100 SXM / H200), for defaults that depend on filling it.
_SMS = 132


def knob_space(target: str, template: str) -> dict[str, tuple[int, ...]]:
    return KNOB_SPACES[(target, template)]


def lib_values(target: str, analysis: Analysis, policy: str = "any") -> tuple[int, ...]:
    """The values knob ``lib`` may take for this plan (empty: no template can write it)."""
    g = analysis.plan.gemm
    if g is None:
        return ()
    custom = g.matmul and (analysis.plan.dtype == "float32" or target == "cuda")
    library = not g.trivial and analysis.plan.dtype == "float32" and policy != "strict"
    return tuple(v for v, ok in ((0, custom), (1, library)) if ok)


def why_not(target: str, analysis: Analysis, policy: str = "any") -> str | None:
    """Why no template can write this plan on ``target`` under ``policy``, or None."""
    plan = analysis.plan
    g = plan.gemm
    if plan.dtype != "float32" and target == "cpu":
        return f"{PREFIX} {plan.dtype} on the cpu target (float32 only there)"
    if g is None or lib_values(target, analysis, policy):
        return None
    if g.op == "conv2d" and g.trivial:
        return (f"{PREFIX} a lone {g.what} (convolution): nothing after the library call to "
                f"fuse, and v1 has no convolution kernel of its own")
    if g.op == "conv2d":
        return (f"{PREFIX} {g.what} under the strict policy (convolution): v1 only fuses "
                f"what follows a library convolution, which needs the permissive policy")
    return f"{PREFIX} this task ({g.what})"  # pragma: no cover - matmul always has lib=0


def conv_layouts(target: str, analysis: Analysis) -> bool:
    """Whether knob ``layout`` applies: a library convolution on cuda, run on the tensors as
    given (0, NCHW) or converted to channels_last (1), whose cuDNN kernels differ. Measured on
    an H200 (2026-11-23, benchmarks/probe_gpu.py): 0.59 ms against 2.36 ms NCHW (an FFT
    algorithm) for L2_5's 64->128 channel conv, but 1.05 against 0.97 ms for L2_4's."""
    g = analysis.plan.gemm
    return target == "cuda" and g is not None and g.op == "conv2d"


def template_space(target: str, analysis: Analysis, lib: int | None,
                   policy: str = "any") -> dict[str, tuple[int, ...]]:
    """The knob space of the template that ``lib`` selects (None: the plan's first)."""
    plan = analysis.plan
    libs = lib_values(target, analysis, policy)
    if plan.pool is not None:
        return dict(knob_space(target, "pool"))
    if plan.gemm is None:
        return dict(knob_space(target, plan.kind))
    if lib not in libs:
        lib = libs[0]
    space: dict[str, tuple[int, ...]] = {"lib": libs}
    if lib == 1:
        space.update(knob_space(target, plan.kind))
        if conv_layouts(target, analysis):
            space["layout"] = (0, 1)
        return space
    gemm = "gemm_tc" if plan.dtype != "float32" else "gemm"
    space.update(knob_space(target, gemm))
    if plan.kind == "row":  # the row kernel after the GEMM has its own knobs
        space.update(knob_space(target, "row"))
    return space


def _fused_defaults(target: str, analysis: Analysis, kind: str) -> dict[str, int]:
    plan = analysis.plan
    if target == "cpu":
        # unroll 4: `omp simd simdlen(16)`, one AVX-512 vector or two AVX2 ones, and libmvec's
        # 16-lane exp. Sigmoid over 1024 x 4096 on one core of the 2-core EPYC (cache flushed
        # before each call): 1.67 ms with simdlen(8), 1.18 ms with 16; eager 1.05 ms.
        if kind == "elementwise":
            return {"threads": 0, "chunk": 16384, "unroll": 4}
        return {"threads": 0, "chunk": 0, "unroll": 4}
    if kind == "elementwise":
        # Measured on H200 (ReLU and GELU over 4096 x 16384): within 1% of eager torch, the
        # best of the 56 variants tried; a persistent grid was ~4% slower.
        return {"block": 256, "vec": 4, "unroll": 2, "persistent": 0}
    cols = rows = 1
    for d in analysis.shape[len(analysis.shape) - plan.k:]:
        cols *= d
    for d in analysis.shape[:len(analysis.shape) - plan.k]:
        rows *= d
    rows, cols = rows * analysis.row_groups, cols // analysis.row_groups
    if cols <= 1024:  # a block per row would leave most of its threads without work
        return {"block": 256, "vec": 4, "warp_per_row": 1, "cache_row": 1, "split": 1, "regs": 0}
    # Few long rows (GroupNorm's 256 rows of 65536): a cluster of blocks per row, so that
    # every SM has work and each block's slice fits in shared memory (64 KB: three blocks of
    # the slice per SM), as long as a slice still gives every thread a vector; enough rows keep
    # a block per row. H200, L2_5 (its row kernel keeping x + bias): 4 blocks of 256 a row
    # 0.084 ms, 8 blocks 0.091, 8 of 512 threads 0.121.
    block = 256 if cols < 8192 else 512
    split = 1
    if rows < 2 * _SMS:
        while (split < 8 and cols // (2 * split) >= block * 4
               and (rows * split < 2 * _SMS or cols * 4 // split > 64 * 1024)):
            split *= 2
    if split > 1:
        block = 256
    # Rows in registers where every reduction is a sum and the row fills 5 to 8 vectors a
    # thread: each pass an unrolled loop with all its loads in flight. H200, 4096 x 16384
    # (probe_gpu.py --only sweep, 2026-11-24), ms: LayerNorm 0.147 -> 0.134, RMSNorm 0.133 ->
    # 0.130, matrix-vector 0.136 -> 0.123, mean 0.069 -> 0.062 (ptxas scheduled its strided
    # loop with fewer loads ahead than the sum's), sum 0.0627 -> 0.0624. Not elsewhere: with a
    # max reduction softmax 0.137 -> 0.183 and max 0.063 -> 0.068; the GroupNorm clusters 0.107
    # -> 0.154 (98 registers); rows of 4 vectors a thread after a GEMM (L2_7's LayerNorm 0.054
    # -> 0.070 ms).
    sums_only = all(n.op == "reduce_sum" for n in plan.nodes if n.op.startswith("reduce_"))
    vectors = -(-cols // (block * 4))  # per thread
    regs = 8 if split == 1 and sums_only and 4 < vectors <= 8 else 0
    return {"block": block, "vec": 4, "warp_per_row": 0, "cache_row": 1, "split": split,
            "regs": regs}


def default_knobs(target: str, analysis: Analysis, lib: int | None = None,
                  policy: str = "any") -> dict[str, int]:
    """Knobs expected to do well at the analysed size (the code itself stays size-generic);
    for a product, those of the template ``lib`` selects (None: the plan's first)."""
    plan = analysis.plan
    if plan.pool is not None:
        # Four outputs per thread, each input row of their windows as two float4 loads and a
        # halo element. H200, L1_18/L1_19 (3x3/2 windows): 0.041 ms, 1.1x torch.compile; with
        # scalar loads 0.065-0.09 ms (benchmarks/probe_gpu.py --only sweep).
        return {"threads": 0} if target == "cpu" else {"block": 256, "cols": 4, "vec": 1}
    if plan.gemm is None:
        return _fused_defaults(target, analysis, plan.kind)
    libs = lib_values(target, analysis, policy)
    lib = lib if lib in libs else libs[0]
    if lib == 1:
        knobs = {"lib": 1, **_fused_defaults(target, analysis, plan.kind)}
        if conv_layouts(target, analysis):
            knobs["layout"] = 0
        return knobs
    if target == "cpu":
        knobs = {"lib": 0, "threads": 0, "tile_m": 32, "tile_n": 128, "k_step": 128, "unroll": 4}
    elif plan.dtype != "float32":
        knobs = {"lib": 0, "tile_m": 128, "tile_n": 128, "k_step": 32, "warp_m": 64,
                 "warp_n": 32, "load_vec": 8, "stages": 2}
    else:
        # Register-blocked SGEMM: 128 x 128 tiles, 8 x 16 per thread (128 threads, 215
        # registers, 2 blocks per SM), warp tiles of 64 x 64, K slabs of 8, float4 loads,
        # double buffering. Measured on an H200 against cuBLAS without TF32 (evidence of
        # 2026-11-23; now `probe_gpu.py --sweep gemm`): 0.89x at 4096^3 and 0.89x batched
        # (L1_15), where 8 x 8 per thread reached 0.80-0.82x with warp tiling, 0.76-0.79x
        # without.
        knobs = {"lib": 0, "tile_m": 128, "tile_n": 128, "k_step": 8, "thread_m": 8,
                 "thread_n": 16, "load_vec": 4, "stages": 2, "cp_async": 0, "min_blocks": 2,
                 "warp_tile": 1}
    if plan.kind == "row":
        knobs.update(_fused_defaults(target, analysis, "row"))
    return knobs


def safe_knobs(target: str, template: str) -> dict[str, int]:
    """The most conservative form: no vector accesses, no unrolling, serial on the host."""
    if template == "pool":
        return {"threads": 1} if target == "cpu" else {"block": 128, "cols": 1, "vec": 0}
    if target == "cpu":
        if template == "gemm":
            return {"threads": 1, "tile_m": 16, "tile_n": 64, "k_step": 64, "unroll": 1}
        return {"threads": 1, "chunk": 16384 if template == "elementwise" else 0, "unroll": 1}
    if template == "elementwise":
        return {"block": 256, "vec": 1, "unroll": 1, "persistent": 1}
    if template == "gemm":
        return {"tile_m": 64, "tile_n": 64, "k_step": 8, "thread_m": 4, "thread_n": 4,
                "load_vec": 1, "stages": 1, "cp_async": 0, "min_blocks": 1, "warp_tile": 0}
    if template == "gemm_tc":
        return {"tile_m": 64, "tile_n": 64, "k_step": 32, "warp_m": 32, "warp_n": 32,
                "load_vec": 1, "stages": 1}
    return {"block": 256, "vec": 1, "warp_per_row": 0, "cache_row": 0, "split": 1, "regs": 0}


def normalize_knobs(knobs: Any, space: dict[str, tuple[int, ...]],
                    fallback: dict[str, int]) -> dict[str, int]:
    """Valid values of ``knobs`` (e.g. a parent's), the fallback's for the rest."""
    out = {k: v for k, v in fallback.items() if k in space}
    if isinstance(knobs, dict):
        for key, values in space.items():
            v = knobs.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and int(v) in values:
                out[key] = int(v)
    return out


def random_knobs(space: dict[str, tuple[int, ...]], rng: random.Random) -> dict[str, int]:
    return {key: rng.choice(values) for key, values in sorted(space.items())}


def mutate_knobs(knobs: dict[str, int], space: dict[str, tuple[int, ...]],
                 rng: random.Random) -> dict[str, int]:
    """Change one or two knobs to another of their values."""
    child = dict(knobs)
    keys = [k for k in sorted(space) if len(space[k]) > 1]
    for key in rng.sample(keys, min(len(keys), rng.choice((1, 2)))):
        child[key] = rng.choice([v for v in space[key] if v != knobs.get(key)])
    return child


def cross_knobs(parents: list[dict[str, int]], space: dict[str, tuple[int, ...]],
                rng: random.Random, fallback: dict[str, int] | None = None) -> dict[str, int]:
    """Each knob from a random parent that has it (else from ``fallback``)."""
    out = {}
    for key in sorted(space):
        have = [p[key] for p in parents if key in p]
        out[key] = rng.choice(have) if have else (fallback or {})[key]
    return out


def _parent_knobs(parent: Parent) -> Any:
    """A parent's knobs: from its record, else from the KNOBS line of its file."""
    knobs = (parent.meta or {}).get("knobs")
    if knobs:
        return knobs
    try:
        for node in ast.parse(parent.code or "").body:
            if (isinstance(node, ast.Assign) and len(node.targets) == 1
                    and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "KNOBS"):
                return ast.literal_eval(node.value)
    except (SyntaxError, ValueError):
        pass
    return None


def strategy_of(analysis: Analysis, knobs: dict[str, int] | None = None) -> str:
    """The niche of a template: a single op streams (vectorize), several fuse (fusion), a row
    reduces (rowreduce), a window pools (pooling); a product tiles (tiling), uses tensor cores (tensor_cores) or leaves
    the product to the library and fuses the rest (epilogue)."""
    plan = analysis.plan
    if plan.pool is not None:
        return "pooling"
    if plan.gemm is not None:
        template = codegen.template_of(plan, knobs or {})
        return {"epilogue": "epilogue", "gemm_tc": "tensor_cores"}.get(template, "tiling")
    if plan.kind == "row":
        return "rowreduce"
    compute = [n for n in plan.nodes if n.op not in ("load", "const", "cols")]
    return "fusion" if len(compute) > 1 or len(plan.leaves) > 1 else "vectorize"


class OfflineSynthesizer:
    """Writes fused elementwise, row-reduction and GEMM(+epilogue) kernels without an LLM.

    ``policy``: ``any`` (default) proposes both forms of a product (own GEMM, library GEMM +
    fused epilogue); ``strict`` only kernels of its own (library forms would be refused by the
    strict kernel audit); ``permissive`` is the same as ``any``.
    """

    name = "offline"

    def __init__(self, target: str = "cpu", policy: str = "any"):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r} (choose from {', '.join(TARGETS)})")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(POLICIES)})")
        self.target = target
        self.policy = policy
        self._analyses: dict[tuple[str, str, str], Analysis | Unsupported] = {}

    # -- shared -------------------------------------------------------------------------------

    def analyse(self, ctx: TaskContext) -> Analysis:
        """The task's plan (cached per task source and size); raises Unsupported, also when
        no template can write the plan on this target under this policy."""
        key = (ctx.task.source_hash, ctx.task.size, str(ctx.task.path))
        if key not in self._analyses:
            try:
                analysis = analyze_task(ctx.task)
                reason = why_not(self.target, analysis, self.policy)
                self._analyses[key] = Unsupported(reason) if reason else analysis
            except Unsupported as e:
                self._analyses[key] = e
        result = self._analyses[key]
        if isinstance(result, Unsupported):
            raise result
        return result

    def space(self, analysis: Analysis, knobs: Any = None) -> dict[str, tuple[int, ...]]:
        """The knob space of the template ``knobs`` (a dict, maybe partial) selects."""
        lib = knobs.get("lib") if isinstance(knobs, dict) else None
        return template_space(self.target, analysis, lib, self.policy)

    def defaults(self, analysis: Analysis, knobs: Any = None) -> dict[str, int]:
        lib = knobs.get("lib") if isinstance(knobs, dict) else None
        return default_knobs(self.target, analysis, lib, self.policy)

    def normalize(self, analysis: Analysis, knobs: Any) -> dict[str, int]:
        """A complete, valid knob set of the template ``knobs`` selects."""
        return normalize_knobs(knobs, self.space(analysis, knobs), self.defaults(analysis, knobs))

    def with_knobs(self, ctx: TaskContext, knobs: dict[str, int]) -> Proposal:
        """The candidate of ``knobs`` over the task's defaults, for sweeps and tests that pick
        the knobs themselves; a knob outside its template's space is an error, not replaced."""
        analysis = self.analyse(ctx)
        space = self.space(analysis, knobs)
        bad = sorted(k for k, v in knobs.items() if v not in space.get(k, ()))
        if bad:
            def allowed(k: str) -> str:
                return (", ".join(map(str, space[k])) if k in space
                        else "none, not a knob of this template")
            raise ValueError(f"{ctx.task.id}: knobs outside the space of their template: "
                             + "; ".join(f"{k}={knobs[k]} (allowed: {allowed(k)})"
                                         for k in bad))
        chosen = {**self.defaults(analysis, knobs), **knobs}
        return self._proposal(ctx, analysis, chosen, "translate", [], time.perf_counter())

    def _proposal(self, ctx: TaskContext, analysis: Analysis, knobs: dict[str, int],
                  operator: str, parents: list[str], started: float) -> Proposal:
        code = codegen.candidate_file(analysis.plan, self.target, knobs, analysis.summary,
                                      ctx.task.source)
        return Proposal(code=code, operator=operator, parents=list(parents),
                        strategy=strategy_of(analysis, knobs),
                        knobs=dict(sorted(knobs.items())), model=self.name,
                        wall_s=round(time.perf_counter() - started, 4))

    def _declined(self, operator: str, parents: list[str], reason: str,
                  started: float) -> list[Proposal]:
        return [Proposal(code=None, operator=operator, parents=list(parents), strategy="none",
                         declined=reason, model=self.name,
                         wall_s=round(time.perf_counter() - started, 4))]

    def _mutant(self, analysis: Analysis, base: dict[str, int],
                rng: random.Random) -> dict[str, int]:
        child = mutate_knobs(base, self.space(analysis, base), rng)
        if child.get("lib") != base.get("lib"):  # another template: its knobs, shared ones kept
            child = self.normalize(analysis, child)
        return child

    # -- the Proposer protocol ----------------------------------------------------------------

    def translate(self, ctx: TaskContext, n: int, rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("translate", [], str(e), started)
        libs = lib_values(self.target, analysis, self.policy) or (None,)
        # The defaults of every template first, then random points of each in turn.
        chosen = []
        for lib in libs:
            d = default_knobs(self.target, analysis, lib, self.policy)
            if d not in chosen:
                chosen.append(d)
            if "layout" in d:  # which layout suits a convolution is known only by timing it
                chosen.append(dict(d, layout=1))
        for i in range(50 * max(n, 1)):
            if len(chosen) >= n:
                break
            lib = libs[i % len(libs)]
            knobs = random_knobs(template_space(self.target, analysis, lib, self.policy), rng)
            if lib is not None:
                knobs["lib"] = lib
            if knobs not in chosen:
                chosen.append(knobs)
        return [self._proposal(ctx, analysis, k, "translate", [], started) for k in chosen[:n]]

    def mutate(self, ctx: TaskContext, parent: Parent, n: int,
               rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("mutate", [parent.id], str(e), started)
        base = self.normalize(analysis, _parent_knobs(parent))
        children: list[dict[str, int]] = []
        for _ in range(50 * max(n, 1)):
            if len(children) >= n:
                break
            child = self._mutant(analysis, base, rng)
            if child != base and child not in children:
                children.append(child)
        return [self._proposal(ctx, analysis, k, "mutate", [parent.id], started)
                for k in children]

    def crossover(self, ctx: TaskContext, parents: list[Parent],
                  rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        ids = [p.id for p in parents]
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("crossover", ids, str(e), started)
        if not parents:
            return []
        pk = [self.normalize(analysis, _parent_knobs(p)) for p in parents]

        def cross() -> dict[str, int]:
            # The template (lib) of a random parent, then each of its knobs from a parent of
            # the same template when one has it.
            first = rng.choice(pk)
            space = self.space(analysis, first)
            same = [p for p in pk if p.get("lib") == first.get("lib")]
            return cross_knobs(same, space, rng, self.defaults(analysis, first))

        child = cross()
        for _ in range(16):  # prefer a child that is none of its parents
            if child not in pk:
                break
            child = cross()
        if child in pk:  # the parents agree on every knob: step off them
            child = self._mutant(analysis, child, rng)
        return [self._proposal(ctx, analysis, child, "crossover", ids, started)]

    def repair(self, ctx: TaskContext, parent: Parent, rng: random.Random) -> list[Proposal]:
        started = time.perf_counter()
        try:
            analysis = self.analyse(ctx)
        except Unsupported as e:
            return self._declined("repair", [parent.id], str(e), started)
        current = _parent_knobs(parent)
        knobs = self.defaults(analysis, current)
        if isinstance(current, dict) and self.normalize(analysis, current) == knobs:
            template = codegen.template_of(analysis.plan, knobs)
            safe = dict(knobs)
            if template in ("gemm", "gemm_tc"):
                safe.update(safe_knobs(self.target, template))
                if analysis.plan.kind == "row":
                    safe.update(safe_knobs(self.target, "row"))
            elif template == "pool":
                safe.update(safe_knobs(self.target, "pool"))
            else:
                safe.update(safe_knobs(self.target, analysis.plan.kind))
            knobs = safe
        return [self._proposal(ctx, analysis, knobs, "repair", [parent.id], started)]
