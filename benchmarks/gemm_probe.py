"""The offline synthesizer's fp32 SIMT GEMM (template gemm) against cuBLAS, knob set by knob set.

    PYTHONPATH=src python benchmarks/gemm_probe.py --out $OUT/gemm_probe.md

Renders the tiled GEMM of the bundled tasks L1_14 (4096^3 square matmul) and L1_15 (128
batched 512 x 1024 x 768) for a handful of knob sets (the previous default, the current one,
variations around it; ``--knobs`` adds more), builds them all at once (``--jobs`` nvcc
processes), checks each against the task's torch.matmul / torch.bmm with TF32 off (max abs
error over the output's max abs value) and times each with CUDA events (``--warmup`` calls,
then the median of ``--runs``), next to the library call timed the same way. Prints the table
and writes it to ``--out``. About a minute on an H200 once the kernels are built.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "src") not in sys.path:
    sys.path.insert(0, str(REPO / "src"))

from synth_suite import build_candidate  # noqa: E402  (benchmarks/, beside this file)

TASKS = ("14_Square_Matmul.py", "15_Batched_Matmul.py")
# Overrides of the synthesizer's default knobs (an empty dict: the defaults themselves).
KNOB_SETS: list[tuple[str, dict[str, int]]] = [
    ("old default", {"thread_n": 8, "warp_tile": 0}),
    ("8 x 8 warp-tiled", {"thread_n": 8}),
    ("default", {}),
    ("contiguous thread tiles", {"warp_tile": 0}),
    ("k_step 16", {"k_step": 16}),
    ("1 block/SM", {"min_blocks": 1}),
    ("single-buffered", {"stages": 1}),
    ("128 x 64 tile", {"tile_n": 64}),
]


def log(msg: str) -> None:
    print(f"[{time.perf_counter() - T0:6.1f}s] {msg}", flush=True)


T0 = time.perf_counter()


def render(task_path: Path, overrides: dict[str, int]) -> tuple[dict[str, int], str]:
    """The knobs (the defaults of the own-GEMM template, overridden) and the candidate file."""
    from assay.propose.base import TaskContext
    from assay.propose.offline import OfflineSynthesizer, codegen
    from assay.tasks.model import Task

    task = Task.from_file(task_path)
    syn = OfflineSynthesizer("cuda", "strict")
    analysis = syn.analyse(TaskContext(task, target="cuda"))
    knobs = syn.normalize(analysis, {**syn.defaults(analysis, {"lib": 0}), **overrides})
    unknown = set(overrides) - set(knobs)
    if unknown or any(knobs[k] != v for k, v in overrides.items()):
        raise ValueError(f"knobs {overrides} are not in the gemm space: {knobs}")
    return knobs, codegen.candidate_file(analysis.plan, "cuda", knobs, analysis.summary,
                                         task.source)


def time_ms(fn, warmup: int, runs: int) -> float:
    """Median of ``runs`` single calls, each between two CUDA events, after ``warmup``."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="file to write the table to (markdown)")
    ap.add_argument("--tasks", nargs="*", default=list(TASKS),
                    help="task files of data/tasks/level1")
    ap.add_argument("--knobs", action="append", default=[],
                    help='another knob set, as JSON overrides, e.g. \'{"k_step": 16}\'')
    ap.add_argument("--only-extra", action="store_true", help="skip the built-in knob sets")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=16, help="nvcc processes at once")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sets = [] if args.only_extra else list(KNOB_SETS)
    sets += [(f"extra {i}", json.loads(k)) for i, k in enumerate(args.knobs)]
    work = Path(tempfile.mkdtemp(prefix="gemm_probe_"))

    # Render every candidate, then build them all at once (nvcc runs in subprocesses).
    cands = []  # (task, label, knobs, path)
    for name in args.tasks:
        task_path = REPO / "data" / "tasks" / "level1" / name
        for i, (label, overrides) in enumerate(sets):
            knobs, code = render(task_path, overrides)
            path = work / f"{task_path.stem}_{i}.py"
            path.write_text(code)
            cands.append((task_path, label, knobs, path))
    log(f"building {len(cands)} candidates ({args.jobs} at once) in {work}")
    with ThreadPoolExecutor(args.jobs) as pool:
        builds = list(pool.map(build_candidate, [str(c[3]) for c in cands]))
    log(f"built: {sum(b['ok'] for b in builds)}/{len(builds)}")

    import torch

    from assay.tasks.instantiate import init_inputs, make_inputs, reference_model
    from assay.tasks.model import Task
    from assay.verify.worker import load_candidate

    torch.backends.cuda.matmul.allow_tf32 = False  # cuBLAS in plain fp32, as the kernels
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device("cuda")
    lines = [f"# GEMM probe: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, "
             f"median of {args.runs} calls (CUDA events)", ""]
    header = "| task | knobs | ms | x cuBLAS | max rel err |"
    for task_path in dict.fromkeys(c[0] for c in cands):
        mod = Task.from_file(task_path).module()
        ref = reference_model(mod, seed=0, device=device)
        inputs = make_inputs(mod, seed=1, device=device)
        with torch.no_grad():
            expected = ref(*inputs)
            lib_ms = time_ms(lambda: ref(*inputs), args.warmup, args.runs)
        scale = expected.abs().max().item()
        log(f"{task_path.stem}: cuBLAS {lib_ms:.3f} ms")
        lines += [f"## {task_path.stem}: cuBLAS (torch, TF32 off) {lib_ms:.3f} ms", "", header,
                  "|---|---|---|---|---|"]
        for (tp, label, knobs, path), built in zip(cands, builds):
            if tp != task_path:
                continue
            shown = ", ".join(f"{k}={v}" for k, v in sorted(knobs.items()) if k != "lib")
            if not built["ok"]:
                lines.append(f"| {tp.stem} | {label}: {shown} | build failed | | |")
                log(f"  {label}: build failed: {built.get('error', '')[:500]}")
                continue
            try:
                model = load_candidate(path).ModelNew(*init_inputs(mod)).to(device).eval()
                with torch.no_grad():
                    got = model(*inputs)
                    torch.cuda.synchronize()
                    err = (got - expected).abs().max().item() / scale
                    ms = time_ms(lambda: model(*inputs), args.warmup, args.runs)
            except Exception as e:  # noqa: BLE001 - one failing knob set; the rest still run
                lines.append(f"| {tp.stem} | {label}: {shown} | {type(e).__name__} | | |")
                log(f"  {label}: {type(e).__name__}: {e}")
                continue
            lines.append(f"| {tp.stem} | {label}: {shown} | {ms:.3f} | {lib_ms / ms:.3f} | "
                         f"{err:.2e} |")
            log(f"  {label}: {ms:.3f} ms, {lib_ms / ms:.3f}x cuBLAS, max rel err {err:.2e}")
        lines.append("")
    table = "\n".join(lines)
    print(table)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
