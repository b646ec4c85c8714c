"""Diagnostics behind issues #4 and #6, run once on the GPU machine before changing code.

    PYTHONPATH=src python3 benchmarks/probe_gpu.py --out $OUT/probe

1. ``noise``: where the IQR of a ~64 us kernel comes from. The timing loop of
   ``assay.bench.timing`` is re-run here with its samples kept in call order, so the spread can
   be split by rotating buffer, and with variants: one buffer against three, no flush, and the
   stream held by a spin kernel while the host enqueues the timed call (nvbench's "blocking
   kernel"), which keeps host launch jitter out of the device time.
2. ``convs``: the per-kernel device time (torch.profiler) of eager L2_5 (conv, GroupNorm, tanh)
   and of the conv tasks' convolutions in NCHW against channels_last.
3. ``sweep``: synthesizer kernels over chosen knob sets (``SWEEPS[--sweep]``: ``synth``, the
   row kernels (norms, softmax, reductions, matrix-vector, the GroupNorm after L2_5's
   convolution); ``gemm``, the fp32 SIMT GEMM of L1_14/L1_15 against cuBLAS; ``gemm_pipeline``,
   its cp.async and 256 x 128 forms; ``conv``, the own convolution's two forms on L1_17 and
   L2_4), built in parallel first, each checked against the
   reference and timed with the verifier's protocol beside eager and torch.compile, with its
   device time per kernel.
4. ``ncu``: Nsight Compute sections of chosen synthesizer kernels (``NCU``).

Writes ``probe.json`` and prints a short table per part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

import torch  # noqa: E402

from assay.bench.timing import CacheFlusher  # noqa: E402

RESULTS: dict = {}


def stats(xs: list[float]) -> dict:
    s = sorted(xs)
    q = statistics.quantiles(s, n=20)
    q4 = statistics.quantiles(s, n=4)
    med = statistics.median(s)
    return {"median": med, "iqr_frac": (q4[2] - q4[0]) / med, "p5": q[0], "p25": q4[0],
            "p75": q4[2], "p95": q[-1], "n": len(s)}


def time_loop(fn, bufs: int, mode: str, runs: int = 300, hold_us: float = 0.0,
              cycles_per_us: float = 1800.0) -> dict:
    dev = torch.device("cuda")
    flush = CacheFlusher(dev, "read") if mode != "none" else None
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    i = 0
    while time.perf_counter() - t0 < 0.3 or i < 2:
        fn(i % bufs)
        i += 1
        torch.cuda.synchronize()
    samples, host = [], []
    for call in range(runs):
        if flush is not None:
            flush()
        if hold_us:
            torch.cuda._sleep(int(hold_us * cycles_per_us))
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if flush is None and not hold_us:
            torch.cuda.synchronize()
        h = time.perf_counter()
        start.record()
        fn(call % bufs)
        end.record()
        host.append((time.perf_counter() - h) * 1e6)
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end))
    out = stats(samples)
    out["host_enqueue_us_median"] = statistics.median(host)
    out["host_enqueue_us_p95"] = statistics.quantiles(host, n=20)[-1]
    out["per_buffer_median"] = [statistics.median(samples[b::bufs]) for b in range(bufs)]
    out["per_buffer_iqr_frac"] = [stats(samples[b::bufs])["iqr_frac"] for b in range(bufs)]
    out["first_half_median"] = statistics.median(samples[: runs // 2])
    out["second_half_median"] = statistics.median(samples[runs // 2:])
    out["raw"] = samples
    return out


def part_noise() -> None:
    g = torch.Generator(device="cuda").manual_seed(0)
    from assay.bench.timing import spin_rate
    cpu = spin_rate(torch.device("cuda"))
    RESULTS["sleep_cycles_per_us"] = cpu
    print(f"_sleep: {cpu:.0f} cycles/us")
    rows = []
    for n in (1 << 25, 1 << 26):
        xs = [torch.randn(n, device="cuda", generator=g) for _ in range(3)]
        outs = [torch.empty_like(x) for x in xs]
        fns = {"torch.relu": lambda b: torch.relu(xs[b]),
               "clamp_min out=": lambda b: torch.clamp_min(xs[b], 0.0, out=outs[b])}
        for fname, fn in fns.items():
            for bufs, mode, hold in ((3, "read", 0), (1, "read", 0), (3, "none", 0),
                                     (3, "read", 40), (1, "read", 40), (3, "read", 100)):
                r = time_loop(fn, bufs, mode, hold_us=hold, cycles_per_us=cpu)
                r.update(kernel=f"{fname} {n}", bufs=bufs, flush=mode, hold_us=hold)
                rows.append(r)
                print(f"{fname:11s} n={n:9d} bufs={bufs} flush={mode:4s} hold={hold:3d}us "
                      f"med={r['median']*1e3:7.2f}us iqr={r['iqr_frac']*100:5.2f}% "
                      f"p5={r['p5']*1e3:.2f} p95={r['p95']*1e3:.2f} per-buf="
                      f"{[round(v * 1e3, 2) for v in r['per_buffer_median']]} "
                      f"halves={r['first_half_median']*1e3:.2f}/{r['second_half_median']*1e3:.2f}"
                      f" host={r['host_enqueue_us_median']:.1f}us", flush=True)
    RESULTS["noise"] = rows


def load_task(path: str):
    from assay.tasks.model import Task
    return Task.from_file(REPO / path, size="large")


def profile_kernels(fn, reps: int = 5) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t:
            rows.append((e.key[:90], t / reps / 1000.0))
    return sorted(rows, key=lambda r: -r[1])


def part_convs() -> None:
    from assay.tasks.instantiate import make_inputs, reference_model
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    out = {}
    for path in ("data/tasks/level2/5_Conv2d_GroupNorm_Tanh.py",
                 "data/tasks/level2/4_Conv2d_ReLU_BiasAdd.py", "data/tasks/level1/17_Conv2d.py"):
        task = load_task(path)
        mod = task.module()
        model = reference_model(mod, 0, "cuda")
        xs = make_inputs(mod, 1, "cuda")
        with torch.no_grad():
            prof = profile_kernels(lambda: model(*xs))
            conv = model.conv
            x = xs[0]
            xcl = x.contiguous(memory_format=torch.channels_last)
            wcl = conv.weight.contiguous(memory_format=torch.channels_last)
            res = {"eager_kernels_ms": prof}
            for name, fn in (
                    ("conv NCHW", lambda: torch.nn.functional.conv2d(
                        x, conv.weight, conv.bias, conv.stride, conv.padding)),
                    ("conv channels_last (input converted inside)", lambda: torch.nn.functional.conv2d(
                        x.contiguous(memory_format=torch.channels_last), wcl, conv.bias,
                        conv.stride, conv.padding)),
                    ("conv channels_last (input already)", lambda: torch.nn.functional.conv2d(
                        xcl, wcl, conv.bias, conv.stride, conv.padding))):
                for bench in (False, True):
                    torch.backends.cudnn.benchmark = bench
                    k = profile_kernels(fn)
                    total = sum(t for _, t in k)
                    res[f"{name} benchmark={bench}"] = {"total_ms": total, "kernels": k[:4]}
                    print(f"{task.id}: {name} cudnn.benchmark={bench}: {total:.3f} ms "
                          f"{[(a[:40], round(b, 3)) for a, b in k[:3]]}", flush=True)
            torch.backends.cudnn.benchmark = False
            print(f"{task.id} eager kernels: {[(a[:50], round(b, 3)) for a, b in prof[:6]]}",
                  flush=True)
        out[task.id] = res
    RESULTS["convs"] = out


def candidate_file(code: str, name: str) -> Path:
    path = Path("/tmp") / f"{name}.py"
    path.write_text(code)
    return path


def load_model(path: Path, mod, ref):
    """The candidate's ModelNew on the device with the reference's state (the verifier's
    loader)."""
    from assay.tasks.instantiate import init_inputs
    from assay.verify.worker import load_candidate
    new = load_candidate(path).ModelNew(*init_inputs(mod)).cuda()
    new.load_state_dict(ref.state_dict())
    return new


# Sweeps: task -> knob sets (over the synthesizer's defaults for the task).
_GEMM_TASKS = ("data/tasks/level1/14_Square_Matmul.py", "data/tasks/level1/15_Batched_Matmul.py")


def _own_gemm(*sets: dict) -> dict:
    """The knob sets on L1_14 and L1_15 with the synthesizer's own GEMM (lib 0)."""
    return {task: [{"lib": 0, **k} for k in sets] for task in _GEMM_TASKS}


_L2_5 = "data/tasks/level2/5_Conv2d_GroupNorm_Tanh.py"
SWEEPS = {
    # the row kernels, strided loop (regs 0) against rows in registers, and the GroupNorm
    # after L2_5's channels_last convolution: the sets behind the tables of
    # docs/evidence/2026-11-24-h200-synthesizer-rows-in-registers.md, sections 1 and 2
    "synth": {
        "data/tasks/level1/12_LayerNorm.py": [
            {"regs": 0}, {"regs": 8}, {"regs": 16, "block": 256}, {"regs": 4, "block": 1024},
            {"regs": 0, "cache_row": 0}],
        "data/tasks/level1/13_RMSNorm.py": [
            {"regs": 0}, {"regs": 8}, {"regs": 16, "block": 256}, {"regs": 4, "block": 1024}],
        "data/tasks/level1/16_Matrix_Vector.py": [
            {"regs": 0}, {"regs": 8}, {"regs": 16, "block": 256}],
        "data/tasks/level1/10_Softmax.py": [{}, {"regs": 8}],
        "data/tasks/level1/11_LogSoftmax.py": [{}, {"regs": 8}],
        "data/tasks/level1/7_Sum_Dim.py": [{"regs": 0}, {"regs": 8}],
        "data/tasks/level1/8_Mean_Dim.py": [{"regs": 0}, {"regs": 8}, {"regs": 4, "block": 1024}],
        "data/tasks/level1/9_Max_Dim.py": [{}, {"regs": 8}],
        _L2_5: [{"lib": 1, "layout": 1, **k} for k in (
            {}, {"split": 8}, {"split": 8, "block": 512}, {"split": 8, "cache_row": 0},
            {"split": 8, "regs": 8}, {"split": 8, "regs": 4, "block": 512},
            {"split": 4, "regs": 16})],
        "data/tasks/level2/6_Linear_Softmax.py": [{"lib": 1}, {"lib": 1, "regs": 8}],
        "data/tasks/level2/7_Linear_Residual_LayerNorm.py": [{"lib": 1}, {"lib": 1, "regs": 8}],
    },
    # the own GEMM: the pre-warp-tiling default, the default, variations around it
    "gemm": _own_gemm({"thread_n": 8, "warp_tile": 0}, {"thread_n": 8}, {}, {"warp_tile": 0},
                      {"k_step": 16}, {"min_blocks": 1}, {"stages": 1}, {"tile_n": 64}),
    # its pipelines against the default: cp.async rings (3, 4 slabs; 2 as cp.async double
    # buffering) and cuBLAS's 256 x 128 tile (ncu: 3 stages, 87% issue against our 78%)
    "gemm_pipeline": _own_gemm(
        {}, {"stages": 3}, {"stages": 3, "k_step": 16}, {"cp_async": 1},
        {"tile_m": 256, "min_blocks": 1}, {"tile_m": 256, "min_blocks": 1, "stages": 3},
        {"tile_m": 256, "min_blocks": 1, "stages": 3, "k_step": 16},
        {"tile_m": 256, "min_blocks": 1, "stages": 4}),
    # the own convolution (lib 2) on L1_17 and L2_4: its first form (the defaults) against its
    # second (gemm_conv's CUDA_CONV_PIPE): double buffering, warp tiles, both, larger tiles
    # (their outputs have hundreds of tiles: split K stays whole there, as it should)
    "conv": {task: [{"lib": 2, **k} for k in (
        {}, {"stages": 2}, {"warp_tile": 1}, {"stages": 2, "warp_tile": 1},
        {"stages": 2, "warp_tile": 1, "split_k": 1},
        {"stages": 2, "warp_tile": 1, "tile_m": 128, "thread_m": 8},
        {"stages": 2, "warp_tile": 1, "tile_m": 128, "thread_m": 8, "k_step": 8},
        {"stages": 2, "warp_tile": 1, "k_step": 32})]
        for task in ("data/tasks/level1/17_Conv2d.py",
                     "data/tasks/level2/4_Conv2d_ReLU_BiasAdd.py")},
}
# A sweep's kernel whose result is off by more than this (relative to the output's largest
# magnitude) is reported as a mismatch: its time says nothing.
SWEEP_TOLERANCE = 1e-4


def part_sweep(name: str, compile_: bool = True) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from synth_suite import build_candidate  # benchmarks/, beside this file

    from assay.bench.baseline import time_reference
    from assay.bench.timing import TimingConfig, time_calls
    from assay.propose.base import TaskContext
    from assay.propose.offline import OfflineSynthesizer
    from assay.tasks.instantiate import make_inputs, reference_model
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = TimingConfig(warmup_s=0.1, min_runs=10, max_runs=200, budget_s=0.4)
    dev = torch.device("cuda")
    syn = OfflineSynthesizer("cuda")
    plan = []  # (task, proposal, candidate file)
    for path, sets in SWEEPS[name].items():
        task = load_task(path)
        ctx = TaskContext(task, target="cuda")
        for knobs in sets:
            p = syn.with_knobs(ctx, knobs)
            plan.append((task, p, candidate_file(p.code, f"sweep_{len(plan)}")))
    t0 = time.perf_counter()
    with ThreadPoolExecutor(12) as pool:
        builds = list(pool.map(build_candidate, [str(f) for _, _, f in plan]))
    print(f"sweep {name}: built {sum(b['ok'] for b in builds)}/{len(plan)} kernels in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)
    out, refs = [], {}
    for (task, p, path), built in zip(plan, builds):
        mod = task.module()
        if task.id not in refs:
            ref = reference_model(mod, 0, "cuda")
            sets = [make_inputs(mod, 10 + k, "cuda") for k in range(3)]
            base = time_reference(task, "cuda", cfg, compile_=compile_)
            eager, compiled = base["eager_ms"], base["compile_ms"] or float("nan")
            refs[task.id] = (ref, sets, eager, compiled)
            kern = profile_kernels(lambda: ref(*sets[0]))
            print(f"{task.id}: eager {eager:.4f} ms, compile {compiled:.4f} ms "
                  f"{[(a[:40], round(b, 4)) for a, b in kern[:4]]}", flush=True)
        ref, sets, eager, compiled = refs[task.id]
        if not built["ok"]:
            out.append({"task": task.id, "knobs": p.knobs, "error": built["error"]})
            print(f"{task.id} {p.knobs}: build failed: {built['error'][:300]}", flush=True)
            continue
        new = load_model(path, mod, ref)
        with torch.no_grad():
            got, want = new(*sets[1]), ref(*sets[1])
            err = ((got - want).abs().max() / want.abs().max()).item()
            ms = time_calls(lambda k: new(*sets[k % 3]), dev, cfg).median_ms
            kern = profile_kernels(lambda: new(*sets[0]), reps=3)
        correct = err <= SWEEP_TOLERANCE  # NaN is not
        row = {"task": task.id, "knobs": p.knobs, "ms": ms, "eager_ms": eager,
               "compile_ms": compiled, "rel_err": err, "correct": correct,
               "kernels": kern[:4]}
        out.append(row)
        print(f"{task.id} {p.knobs}: {ms:.4f} ms = {eager / ms:.2f}x eager, "
              f"{compiled / ms:.2f}x compile; err {err:.1e}{'' if correct else ' MISMATCH'} "
              f"{[(a[:30], round(b, 4)) for a, b in kern[:3]]}", flush=True)
    RESULTS[f"sweep_{name}"] = out


# task: knobs (over the defaults), for ncu
NCU = {
    "data/tasks/level1/8_Mean_Dim.py": {},
    "data/tasks/level1/7_Sum_Dim.py": {},
    "data/tasks/level1/13_RMSNorm.py": {},
}


def part_ncu() -> None:
    """Nsight Compute on the synthesizer's kernels (``NCU``)."""
    import subprocess
    from assay.propose.base import TaskContext
    from assay.propose.offline import OfflineSynthesizer
    syn = OfflineSynthesizer("cuda")
    files = []
    for path, knobs in NCU.items():
        task = load_task(path)
        p = syn.with_knobs(TaskContext(task, target="cuda"), knobs)
        files.append((str(REPO / path), str(candidate_file(p.code, f"ncu_{task.id}"))))
    for task_path, cand in files:
        cmd = ["ncu", "--clock-control", "none", "--kernel-name", "regex:assay_(rows|pool)",
               "--launch-skip", "2", "--launch-count", "1", "--section", "SpeedOfLight",
               "--section", "Occupancy", "--section", "WarpStateStats",
               "--section", "MemoryWorkloadAnalysis", "--section", "LaunchStats",
               "--section", "MemoryWorkloadAnalysis_Tables",
               sys.executable, __file__, "--ncu-child", task_path, cand]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=240,
                           env={**__import__("os").environ, "PYTHONPATH": str(REPO / "src")})
        keep = [ln for ln in r.stdout.splitlines()
                if any(k in ln for k in ("Duration", "Throughput", "Occupancy", "Stall",
                                         "Registers", "Block Size", "Grid Size", "Waves",
                                         "Shared Memory", "Warp Cycles", "Issued", "L1/TEX Hit",
                                         "L2 Hit", "Mem Busy", "Max Bandwidth", "assay_",
                                         "Mem Pipes", "sectors", "Sectors", "Uncoalesced",
                                         "excessive", "Eligible"))]
        print(f"--- ncu {Path(cand).name} rc={r.returncode}")
        print("\n".join(keep[:70]) or r.stderr[-2000:], flush=True)
        RESULTS.setdefault("ncu", {})[Path(cand).name] = r.stdout[-20000:]


def ncu_child(task_path: str, cand: str) -> None:
    from assay.tasks.instantiate import make_inputs, reference_model
    from assay.tasks.model import Task
    task = Task.from_file(task_path, size="large")
    mod = task.module()
    ref = reference_model(mod, 0, "cuda")
    xs = make_inputs(mod, 1, "cuda")
    new = load_model(Path(cand), mod, ref)
    with torch.no_grad():
        for _ in range(4):
            new(*xs)
    torch.cuda.synchronize()


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--ncu-child":
        ncu_child(sys.argv[2], sys.argv[3])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="noise,convs,sweep",
                    help="comma-separated parts: noise, convs, sweep, ncu")
    ap.add_argument("--sweep", default="synth", choices=sorted(SWEEPS),
                    help="the knob sets of part sweep")
    ap.add_argument("--no-compile", action="store_true",
                    help="part sweep: time eager only (torch.compile takes ~20 s a task)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    RESULTS["device"] = torch.cuda.get_device_name(0)
    for part in args.only.split(","):
        t = time.perf_counter()
        try:
            {"noise": part_noise, "convs": part_convs, "ncu": part_ncu,
             "sweep": lambda: part_sweep(args.sweep, not args.no_compile)}[part]()
        except Exception as e:  # noqa: BLE001 - the other parts still run
            import traceback
            traceback.print_exc()
            RESULTS[f"{part}_error"] = repr(e)
        print(f"== {part}: {time.perf_counter() - t:.1f} s", flush=True)
        (args.out / "probe.json").write_text(json.dumps(RESULTS, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
