"""Where the time goes when the verifier judges one level-1 candidate (issue #3: under 10 s per
candidate at H100 sizes on the GPU, compile excluded).

    python benchmarks/verify_speed.py                       # cuda if present (large), else cpu (small)
    python benchmarks/verify_speed.py --device cuda --transfer cuda_ipc --repeat 3
    python benchmarks/verify_speed.py --device cpu --size small --json out.json

It verifies an honest row-softmax kernel (CUDA on cuda, C++ on cpu) for the bundled
``data/tasks/level1/10_Softmax.py`` (4096 x 16384 at the large size: 256 MB per input set,
8 sets, 11 verified outputs) and prints the split: prepare (secret inputs, references in the
task's dtype and float64; once per task and generation), the input arena (written once per
prepared task on the host path), the job, the worker (spawn, torch import, materializing the
inputs, correctness and staleness calls, timing, post-timing checks, audit, exit) and the
comparison on the device. The kernel is built before the clock starts ("compile excluded").
``--repeat N`` verifies the same file N times against the same preparation, as the verify step
does for the candidates of one generation.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

CUDA_SOURCE = r"""
#include <cstdint>
#include <cuda_runtime.h>
#include <math_constants.h>

__device__ __forceinline__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// One block per row: online max/sum per thread, then block reductions, then the write pass.
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int64_t cols) {
  __shared__ float s_m[32], s_s[32];
  const float* xr = x + (int64_t)blockIdx.x * cols;
  float* yr = y + (int64_t)blockIdx.x * cols;
  float m = -CUDART_INF_F, s = 0.f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    float v = xr[c];
    if (v > m) { s = s * __expf(m - v) + 1.f; m = v; } else { s += __expf(v - m); }
  }
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  float wm = warp_max(m);
  s = warp_sum(s * __expf(m - wm));
  if (lane == 0) { s_m[warp] = wm; s_s[warp] = s; }
  __syncthreads();
  if (warp == 0) {
    float bm = lane < nw ? s_m[lane] : -CUDART_INF_F;
    float bs = lane < nw ? s_s[lane] : 0.f;
    float tm = warp_max(bm);
    bs = warp_sum(lane < nw ? bs * __expf(bm - tm) : 0.f);
    if (lane == 0) { s_m[0] = tm; s_s[0] = bs; }
  }
  __syncthreads();
  float row_m = s_m[0], inv = 1.f / s_s[0];
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) yr[c] = __expf(xr[c] - row_m) * inv;
}
extern "C" int softmax(const float* x, float* y, int64_t rows, int64_t cols, cudaStream_t s) {
  softmax_rows<<<(unsigned)rows, 1024, 0, s>>>(x, y, cols);
  return (int)cudaGetLastError();
}
"""

CPP_SOURCE = r"""
#include <cmath>
#include <cstdint>
extern "C" int softmax(const float* x, float* y, int64_t rows, int64_t cols, void* unused) {
  #pragma omp parallel for
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float m = -INFINITY, s = 0.f;
    for (int64_t c = 0; c < cols; ++c) m = xr[c] > m ? xr[c] : m;
    for (int64_t c = 0; c < cols; ++c) { yr[c] = expf(xr[c] - m); s += yr[c]; }
    float inv = 1.f / s;
    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;
  }
  return 0;
}
"""

CANDIDATE = '''
import ctypes
import torch
from torch import nn
from assay.bench.build import load_library

SOURCE = {source!r}
_lib = load_library(SOURCE, {lang!r})


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        stream = torch.cuda.current_stream().cuda_stream if x.is_cuda else 0
        err = _lib.softmax(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(y.data_ptr()),
                           ctypes.c_int64(x.shape[0]), ctypes.c_int64(x.shape[1]),
                           ctypes.c_void_p(stream))
        if err:
            raise RuntimeError(f"kernel error {{err}}")
        return y
'''

SPLIT = [  # (label, key in the verifier's times dict)
    ("prepare (inputs, references fp32+fp64; once per task)", "prepare_s"),
    ("input arena (host path; written once per task)", "inputs_arena_s"),
    ("job + landing arena", "job_s"),
    ("worker: spawn (sandbox launcher)", "spawn_s"),
    ("worker: import torch", "import_s"),
    ("worker: read job", "worker.job_s"),
    ("worker: materialize inputs (transfer in)", "worker.materialize_s"),
    ("worker: load candidate (cached build)", "worker.load_s"),
    ("worker: correctness + staleness calls", "worker.correctness_s"),
    ("worker: timing", "worker.timing_s"),
    ("worker: post-timing checks", "worker.after_s"),
    ("worker: audit (profiler)", "worker.audit_s"),
    ("worker: exit + sandbox teardown", "exit_s"),
    ("compare on the device (incl. landing transfer)", "compare_s"),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default=str(REPO / "data/tasks/level1/10_Softmax.py"))
    ap.add_argument("--device", default="auto")
    ap.add_argument("--size", default=None, help="large | small (default: large on cuda)")
    ap.add_argument("--transfer", default="draw", choices=["draw", "host", "cuda_ipc"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=0.5, help="timing budget (config default)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    import torch

    from assay.bench.build import build
    from assay.tasks.model import Task
    from assay.verify.harness import prepare, verify
    from assay.verify.reference import resolve_device
    from assay.verify.settings import VerifyConfig

    device = resolve_device(args.device)
    size = args.size or ("large" if device.startswith("cuda") else "small")
    task = Task.from_file(args.task, size=size)
    lang = "cuda" if device.startswith("cuda") else "cpp"
    source = CUDA_SOURCE if lang == "cuda" else CPP_SOURCE
    t = time.perf_counter()
    build(source, lang)  # compile excluded from the measurement
    build_s = time.perf_counter() - t
    cand = Path(tempfile.mkdtemp(prefix="assay-bench-")) / "softmax_candidate.py"
    cand.write_text(CANDIDATE.format(source=source, lang=lang))
    cfg = VerifyConfig(transfer=args.transfer, budget_s=args.budget_s)

    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    print(f"task {task.id} ({size}), device {device} ({name}), transfer {args.transfer}, "
          f"build {build_s:.1f} s (excluded)")
    t = time.perf_counter()
    prep = prepare(task, device, cfg)
    prepare_s = time.perf_counter() - t
    shapes = [tuple(x.shape) for x in prep.sets[0] if isinstance(x, torch.Tensor)]
    set_mb = sum(x.numel() * x.element_size() for x in prep.sets[0]
                 if isinstance(x, torch.Tensor)) / 2**20
    out_mb = sum(r.numel() * r.element_size() for r in prep.refs[0]) / 2**20
    print(f"inputs {shapes}: {set_mb:.0f} MB per set x {len(prep.sets)} sets; outputs "
          f"{out_mb:.0f} MB x 11 verified calls; longest reduction {prep.reduction}")
    runs = []
    for i in range(args.repeat):
        times: dict = {}
        t = time.perf_counter()
        v = verify(task, cand, device, cfg, prepared=prep, times=times)
        total = time.perf_counter() - t
        times["prepare_s"] = prepare_s if i == 0 else 0.0
        runs.append({"verdict": {"accepted": v.accepted, "reasons": v.reasons,
                                 "runtime_ms": v.runtime_ms}, "times": times,
                     "verify_s": total, "with_prepare_s": total + times["prepare_s"]})
        print(f"\nrun {i + 1}: {'ACCEPTED' if v.accepted else 'REJECTED ' + str(v.reasons)}, "
              f"runtime {v.runtime_ms:.4g} ms, transfer {times.get('transfer')}"
              + (f" (fallback: {times['transfer_fallback']})" if "transfer_fallback" in times
                 else ""))
        if not v.accepted:
            for r in v.reasons:
                print(f"  {r}: {v.checks[r]['detail'][:300]}")
        for label, key in SPLIT:
            if key in times and isinstance(times[key], (int, float)):
                print(f"  {label:55s} {times[key]:7.2f} s")
        print(f"  {'verify (this candidate)':55s} {total:7.2f} s")
        print(f"  {'verify + prepare':55s} {total + times['prepare_s']:7.2f} s")
    if args.json:
        Path(args.json).write_text(json.dumps({"task": task.id, "size": size, "device": device,
                                               "device_name": name, "transfer": args.transfer,
                                               "prepare_s": prepare_s, "runs": runs}, indent=2,
                                              default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
