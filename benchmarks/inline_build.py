"""Where a load_inline candidate's ~45 s build goes, and what each idea cuts (issue 16's target:
cold build median <= 12 s, cached ~0 s). Run on the GPU machine (nvcc and a CUDA torch):

    python benchmarks/inline_build.py [--repeat 3] [--variants all] [--out DIR]

Each variant builds the same KernelBench-style candidate (an elementwise CUDA kernel whose CUDA
source includes torch/extension.h, as LLMs write them) from scratch, in a fresh process with a
fresh build folder and a salted source (no cache of torch's or ours can help), and records the
wall time and ninja's per-step times (``.ninja_log``: the C++ binding ``main.o``, the CUDA file
``cuda.cuda.o``, the link):

- ``torch_default_no_gpu``: torch's load_inline as the prebuild saw it before (no GPU visible,
  no TORCH_CUDA_ARCH_LIST: every architecture torch knows);
- ``torch_default``: torch's load_inline with the GPU visible (its arch, +PTX);
- ``arch_only``: TORCH_CUDA_ARCH_LIST = the device's arch, no PTX (what assay.bench.inline sets);
- ``arch_only_serial``: the same with MAX_JOBS=1 (what parallel ninja buys);
- ``arch_only_pch``: the same plus torch's ``use_pch=True`` (a precompiled torch/extension.h for
  the C++ file; g++ only; torch writes it beside its headers, so this needs write access there);
- ``arch_only_light_header``: the same with the CUDA source including ``torch/types.h`` instead
  of ``torch/extension.h`` (no pybind11 or Python headers through nvcc);
- ``assay_cold`` / ``assay_cached``: assay.bench.inline.cached_load_inline into an empty kernel
  cache (its light build: ATen's core and slim per-operator headers in both files), then the
  same content again (a second worker: an import of the cached library).

Writes ``DIR/inline_build.json`` and ``DIR/inline_build.md`` (median seconds per variant and
the split). Expected run time: about 6 x 45 s x repeat on an H100 host, less as variants win.
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

CUDA_SRC = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void swish_kernel(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
  int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (; i < n; i += stride) { float v = x[i]; y[i] = v / (1.f + __expf(-v)); }
}

torch::Tensor swish_cuda(torch::Tensor x) {
  auto y = torch::empty_like(x);
  int64_t n = x.numel();
  int threads = 256;
  int blocks = (int)std::min<int64_t>((n + threads - 1) / threads, 65535);
  swish_kernel<<<blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
  return y;
}
"""
CPP_SRC = "torch::Tensor swish_cuda(torch::Tensor x);"

VARIANTS = ("torch_default_no_gpu", "torch_default", "arch_only", "arch_only_serial",
            "arch_only_pch", "arch_only_light_header", "assay_cold", "assay_cached")

# Runs in a fresh interpreter: argv = variant, salt, build dir, kernel cache.
CHILD = r"""
import json, os, sys, time
variant, salt, build_dir, cache = sys.argv[1:5]
os.environ["ASSAY_KERNEL_CACHE"] = cache
sys.path.insert(0, os.path.join(sys.argv[5], "src"))
sys.path.insert(0, os.path.join(sys.argv[5], "benchmarks"))
from inline_build import CPP_SRC, CUDA_SRC
import torch
from torch.utils.cpp_extension import load_inline
cuda = CUDA_SRC + f"\n// salt {salt}\n"
if variant.endswith("_light_header"):  # what the CUDA file's torch include costs
    cuda = cuda.replace("<torch/extension.h>", "<torch/types.h>")
name = f"swish_{salt}"
kw = dict(name=name, cpp_sources=CPP_SRC, cuda_sources=cuda, functions=["swish_cuda"],
          extra_cuda_cflags=["-O3"], verbose=False)
t = time.perf_counter()
if variant.startswith("assay"):
    from assay.bench import inline
    inline.install()
    mod = inline.cached_load_inline(**kw)
else:
    mod = load_inline(build_directory=build_dir, use_pch=variant.endswith("_pch"), **kw)
seconds = time.perf_counter() - t
ok = None
if torch.cuda.is_available():
    x = torch.randn(1 << 20, device="cuda")
    ok = bool(torch.allclose(mod.swish_cuda(x), x * torch.sigmoid(x), atol=1e-5))
print(json.dumps({"seconds": seconds, "correct": ok}))
"""


def ninja_steps(build_dir: Path) -> dict[str, float]:
    """Seconds per output from ninja's log (start and end in ms, tab-separated)."""
    log = build_dir / ".ninja_log"
    out: dict[str, float] = {}
    if not log.exists():
        return out
    for line in log.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) >= 4 and parts[0].isdigit():
            out[parts[3]] = (int(parts[1]) - int(parts[0])) / 1000
    return out


def run_variant(variant: str, salt: str, cache: Path, arch: str, timeout_s: float = 240) -> dict:
    env = dict(os.environ)
    env.pop("TORCH_CUDA_ARCH_LIST", None)
    env.pop("MAX_JOBS", None)
    if variant == "torch_default_no_gpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    if variant.startswith("arch_only"):
        env["TORCH_CUDA_ARCH_LIST"] = arch
    if variant == "arch_only_serial":
        env["MAX_JOBS"] = "1"
    if variant.startswith("assay"):
        env["ASSAY_CUDA_ARCH"] = "sm_" + arch.replace(".", "")
    with tempfile.TemporaryDirectory(prefix="inline-bench-") as tmp:
        build_dir = Path(tmp) / "build"
        build_dir.mkdir()
        env["TORCH_EXTENSIONS_DIR"] = str(Path(tmp) / "ext")
        t = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, "-c", CHILD, variant, salt, str(build_dir),
                                   str(cache), str(REPO)], env=env, capture_output=True,
                                  text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return {"variant": variant, "salt": salt, "wall_s": time.perf_counter() - t,
                    "rc": 124, "error": f"over {timeout_s:.0f} s"}
        wall = time.perf_counter() - t
        row = {"variant": variant, "salt": salt, "wall_s": wall, "rc": proc.returncode}
        if proc.returncode == 0:
            row.update(json.loads(proc.stdout.strip().splitlines()[-1]))
            row["steps"] = ninja_steps(build_dir)
        else:
            row["error"] = (proc.stdout + proc.stderr)[-1500:]
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--arch", default=None, help="e.g. 9.0 (default: the device's)")
    p.add_argument("--out", default="inline_build_out")
    p.add_argument("--timeout-s", type=float, default=240, help="per build (a failed row after)")
    a = p.parse_args(argv)
    import torch

    from assay.bench.inline import arch_list

    arch = a.arch or (arch_list("sm_%d%d" % torch.cuda.get_device_capability())
                      if torch.cuda.is_available() else "9.0")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for r in range(a.repeat):
        cache = Path(tempfile.mkdtemp(prefix="inline-bench-cache-"))
        for v in a.variants:
            # assay_cached builds what assay_cold built: the same salt, the same content
            salt = f"{'assay_cold' if v == 'assay_cached' else v}_{r}_{os.getpid()}"
            if v == "assay_cached" and "assay_cold" not in a.variants:
                run_variant("assay_cold", salt, cache, arch, a.timeout_s)  # fill the cache
            row = run_variant(v, salt, cache, arch, a.timeout_s)
            rows.append(row)
            print(f"[{r + 1}/{a.repeat}] {v}: {row.get('seconds', float('nan')):.1f} s "
                  f"(wall {row['wall_s']:.1f} s, rc {row['rc']}, correct {row.get('correct')})"
                  + (f"\n{row['error']}" if "error" in row else ""), flush=True)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
    lines = [f"# load_inline build times ({gpu}, torch {torch.__version__}, arch {arch}, "
             f"{os.cpu_count()} cores)", "",
             "| variant | median s (build call) | median wall s (process) | main.o s | cuda.o s "
             "| link s | runs |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for v in a.variants:
        rs = [x for x in rows if x["variant"] == v and x["rc"] == 0]
        if not rs:
            lines.append(f"| {v} | failed | | | | | 0 |")
            continue
        med = lambda k: statistics.median(x[k] for x in rs)  # noqa: E731
        step = lambda suffix: statistics.median(  # noqa: E731
            [next((s for o, s in x.get("steps", {}).items() if o.endswith(suffix)), 0.0)
             for x in rs])
        lines.append(f"| {v} | {med('seconds'):.2f} | {med('wall_s'):.2f} | {step('main.o'):.1f} | "
                     f"{step('cuda.o'):.1f} | {step('.so'):.1f} | {len(rs)} |")
    (out / "inline_build.json").write_text(json.dumps(rows, indent=2) + "\n")
    (out / "inline_build.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
