"""Batch verification throughput: candidates per GPU-hour, batch against a sequential loop over
the same candidates in the same run (issue 16's target: >= 300 per GPU-hour at KernelBench
sizes). Run on the GPU machine:

    python benchmarks/verify_batch.py --source /path/to/KernelBench/KernelBench --out DIR \\
        [--samples 3] [--build-workers 8] [--sequential 4] [--budget-s 560]

Candidates: ``--candidates DIR`` (any layout ``assay verify`` pairs: KernelBench's runs folder,
``<task stem>/*.py``, files named after tasks), or, by default, ``load_inline`` CUDA candidates
written here for KernelBench's level-1 elementwise tasks (ReLU ... HardTanh, 12 tasks,
``--samples`` block sizes each, distinct sources: every one is a cold build), in KernelBench's
runs layout under ``DIR/runs/``: the format LLMs and KernelBench write.

- ``batch``: ``assay.verify.batch.run_batch`` (one preparation and one cached baseline per task,
  builds in ``--build-workers`` sandboxed processes on the CPU cores while the GPU verifies),
  empty kernel and baseline caches at the start.
- ``sequential``: the first ``--sequential`` of the same candidates, one ``assay verify --task T
  --candidate C`` process each, each with empty caches (a build inside the worker, baselines
  timed per call): the loop a user ran before. Per-hour rates compare the two.

Writes ``DIR/verify_batch.json`` (every row, the rates) and ``DIR/verify_batch.md``. The batch
part stops starting candidates when ``--budget-s`` is near (at least half of it is the batch's,
whatever the sequential loop took); a rerun starts a fresh JSONL (a rate is measured over one
uninterrupted call).
Expected run time: the sequential part ~100 s per candidate, the batch part ~10 s per candidate
plus ~1 min of first builds. KernelBench's elementwise tasks are 4096 x 393216 floats (6.4 GB
an input): they need the memory-planned verifier (verdict too_large instead of a crash).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
# The sandboxed workers are separate interpreters: they import this checkout's assay too.
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(REPO / "src")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])

# KernelBench level-1 task number -> (per-element CUDA expression of float v and parameter p,
# the parameter's default when the task's constructor gets none).
ELEMENTWISE = {
    19: ("fmaxf(v, 0.f)", 0.0),
    20: ("v > 0.f ? v : p * v", 0.01),
    21: ("1.f / (1.f + expf(-v))", 0.0),
    22: ("tanhf(v)", 0.0),
    25: ("v / (1.f + expf(-v))", 0.0),
    26: ("0.5f * v * (1.f + erff(v * 0.70710678118654752f))", 0.0),
    27: ("v > 0.f ? 1.0507009873554805f * v : 1.0507009873554805f * 1.6732632423543772f * "
         "expm1f(v)", 0.0),
    28: ("fminf(fmaxf(v + 3.f, 0.f), 6.f) / 6.f", 0.0),
    29: ("v > 20.f ? v : log1pf(expf(v))", 0.0),
    30: ("v / (1.f + fabsf(v))", 0.0),
    31: ("v > 0.f ? v : p * expm1f(v)", 1.0),
    32: ("fminf(fmaxf(v, -1.f), 1.f)", 0.0),
}
BLOCKS = (256, 512, 128, 1024)

CANDIDATE = '''import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

__global__ void elementwise_kernel(const float* __restrict__ x, float* __restrict__ y,
                                   int64_t n, float p) {{
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) {{
    float v = x[i];
    y[i] = {expr};
  }}
}}

torch::Tensor elementwise_forward(torch::Tensor x, double p) {{
  TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "float32 cuda tensor");
  auto xc = x.contiguous();
  auto y = torch::empty_like(xc);
  int64_t n = xc.numel();
  const int threads = {threads};
  int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, (int64_t)132 * 32);
  if (n > 0) {{
    elementwise_kernel<<<(int)blocks, threads, 0, c10::cuda::getCurrentCUDAStream()>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), n, (float)p);
  }}
  return y;
}}
"""

cpp_source = "torch::Tensor elementwise_forward(torch::Tensor x, double p);"

_ext = load_inline(name="kb_l1_{number}_t{threads}", cpp_sources=cpp_source,
                   cuda_sources=cuda_source, functions=["elementwise_forward"],
                   extra_cuda_cflags=["-O3"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, *args):
        super().__init__()
        self.p = float(args[0]) if args else {default!r}

    def forward(self, x):
        return _ext.elementwise_forward(x, self.p)
'''


def write_candidates(source: Path, runs: Path, samples: int,
                     numbers: list[int] | None = None) -> list[Path]:
    runs.mkdir(parents=True, exist_ok=True)
    out = []
    level1 = source / "level1"
    for number, (expr, default) in ELEMENTWISE.items():
        if numbers and number not in numbers or not list(level1.glob(f"{number}_*.py")):
            continue
        for s in range(samples):
            path = runs / f"level_1_problem_{number}_sample_{s}_kernel.py"
            path.write_text(CANDIDATE.format(expr=expr, threads=BLOCKS[s % len(BLOCKS)],
                                             number=number, default=default))
            out.append(path)
    return out


def verify_config():
    """The strict policy as `assay verify` composes it (Hydra), or its dataclass defaults."""
    try:
        from assay.app import compose
        from assay.verify.config import from_cfg

        return from_cfg(compose(["verify=strict"]).verify)
    except ImportError:
        from assay.verify.settings import VerifyConfig

        return VerifyConfig()


def run_sequential(pairs, device: str, limit: int, deadline: float, work: Path) -> list[dict]:
    rows = []
    for i, p in enumerate(pairs[:limit], 1):
        if time.perf_counter() > deadline:
            break
        caches = Path(tempfile.mkdtemp(prefix="seq-caches-", dir=work))
        env = {**os.environ, "ASSAY_KERNEL_CACHE": str(caches / "kernels"),
               "ASSAY_BASELINE_CACHE": str(caches / "baselines"),
               "PYTHONPATH": str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
        out = caches / "verdict.json"
        t = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "assay.cli", "verify", "--task", str(p.task),
                               "--candidate", str(p.candidate), "--device", device, "--json",
                               str(out)], env=env, capture_output=True, text=True)
        secs = time.perf_counter() - t
        v = json.loads(out.read_text()) if out.exists() else {}
        checks = v.get("checks") or {}
        rows.append({"candidate": str(p.candidate), "seconds": secs, "rc": proc.returncode,
                     "accepted": v.get("accepted"), "reasons": v.get("reasons"),
                     "details": {r: (checks.get(r) or {}).get("detail", "")[:600]
                                 for r in v.get("reasons") or []},
                     "times": v.get("times"),
                     "tail": (proc.stdout + proc.stderr)[-600:] if proc.returncode > 1 else ""})
        print(f"sequential [{i}/{min(limit, len(pairs))}] {Path(p.candidate).name}: "
              f"{secs:.1f} s, rc {proc.returncode}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    a = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    a.add_argument("--source", required=True, help="KernelBench's task root (level1/ ...)")
    a.add_argument("--out", required=True)
    a.add_argument("--candidates", help="a folder of your candidates (default: generated)")
    a.add_argument("--samples", type=int, default=3, help="generated candidates per task")
    a.add_argument("--problems", type=int, nargs="+", default=None,
                   help=f"level-1 problems to generate for (default: {sorted(ELEMENTWISE)})")
    a.add_argument("--build-workers", type=int, default=8)
    a.add_argument("--sequential", type=int, default=4,
                   help="candidates for the sequential loop (0: skip it)")
    a.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    a.add_argument("--size", default="large", choices=["large", "small"])
    a.add_argument("--budget-s", type=float, default=560.0)
    args = a.parse_args(argv)
    t_start = time.perf_counter()
    deadline = t_start + args.budget_s

    from assay.verify.batch import pair_candidates, run_batch
    from assay.verify.selfcheck import task_files

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="verify-batch-"))
    cands = Path(args.candidates) if args.candidates else out / "runs"
    if not args.candidates:
        write_candidates(Path(args.source), cands, args.samples, args.problems)
    pairs, unmatched = pair_candidates(task_files([args.source]), cands)
    for u in unmatched:
        print(f"warning: {u}", file=sys.stderr)
    if not pairs:
        print(f"error: {cands}: no candidates paired with tasks of {args.source}", file=sys.stderr)
        return 2
    cfg = verify_config()

    # The sequential loop first, on the first candidates (none started after 40% of the
    # budget; one may run over it: a 6 GB task took 234 s on an H200), then the batch over all
    # of them with what is left, but never less than half the budget.
    seq = run_sequential(pairs, args.device, args.sequential,
                         t_start + args.budget_s * 0.4, work) if args.sequential else []
    deadline = max(deadline, time.perf_counter() + args.budget_s * 0.5)

    os.environ["ASSAY_KERNEL_CACHE"] = str(work / "batch" / "kernels")
    os.environ["ASSAY_BASELINE_CACHE"] = str(work / "batch" / "baselines")
    t = time.perf_counter()
    jsonl = out / "batch.jsonl"
    jsonl.unlink(missing_ok=True)  # a rate is measured over one uninterrupted call
    rows = run_batch(pairs, args.device, cfg, args.size, jsonl=jsonl, baselines=True,
                     build_workers=args.build_workers, budget_s=deadline - t,
                     progress=lambda line: print(line, flush=True))
    batch_s = time.perf_counter() - t

    import torch

    seq_s = sum(r["seconds"] for r in seq)
    # Once per task: degeneracy, baseline timing (eager + torch.compile) and preparation.
    setup_s = sum((r.get("times") or {}).get("task_setup_s") or 0 for r in rows)
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__, "cpu_cores": os.cpu_count(),
        "build_workers": args.build_workers, "candidates": len(pairs),
        "batch": {"verified": len(rows), "seconds": batch_s,
                  "per_gpu_hour": len(rows) / batch_s * 3600 if batch_s else None,
                  "accepted": sum(bool(r.get("accepted")) for r in rows),
                  "median_verify_s": statistics.median([r.get("seconds") or 0 for r in rows])
                  if rows else None,
                  "median_build_s": statistics.median([r.get("build_s") or 0 for r in rows])
                  if rows else None,
                  "task_setup_s": setup_s,
                  "per_gpu_hour_baselines_cached": len(rows) / (batch_s - setup_s) * 3600
                  if batch_s > setup_s else None},
        "sequential": {"verified": len(seq), "seconds": seq_s,
                       "per_gpu_hour": len(seq) / seq_s * 3600 if seq_s else None,
                       "median_s": statistics.median([r["seconds"] for r in seq]) if seq else None,
                       "accepted": sum(bool(r.get("accepted")) for r in seq)},
        "rows": rows, "sequential_rows": seq,
    }
    (out / "verify_batch.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    b, s = result["batch"], result["sequential"]
    fmt = lambda x, f="{:.0f}": "-" if x is None else f.format(x)  # noqa: E731
    md = [f"# Batch verification throughput ({result['device']}, torch {result['torch']}, "
          f"{result['cpu_cores']} cores, {args.build_workers} build workers)", "",
          "| mode | candidates | accepted | seconds | per GPU-hour | median s per candidate |",
          "| --- | --- | --- | --- | --- | --- |",
          f"| batch | {b['verified']} | {b['accepted']} | {b['seconds']:.0f} | "
          f"{fmt(b['per_gpu_hour'])} | {fmt(b['median_verify_s'], '{:.1f}')} (verify), "
          f"{fmt(b['median_build_s'], '{:.1f}')} (build, overlapped) |",
          f"| sequential `assay verify` | {s['verified']} | {s['accepted']} | {s['seconds']:.0f} | "
          f"{fmt(s['per_gpu_hour'])} | {fmt(s['median_s'], '{:.1f}')} |", "",
          f"Task setup (degeneracy, eager and torch.compile baselines, preparation; once per "
          f"task): {b['task_setup_s']:.0f} s of the batch's {b['seconds']:.0f} s; without it "
          f"(baselines already cached) {fmt(b['per_gpu_hour_baselines_cached'])} per GPU-hour.",
          ""]
    rejected = [r for r in rows if not r.get("accepted")]
    if rejected:
        md += ["Not accepted:", ""] + [
            f"- {Path(r['candidate']).name} ({r['task']}): "
            f"{', '.join(r.get('reasons') or []) or r.get('error', '')}" for r in rejected]
    (out / "verify_batch.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
