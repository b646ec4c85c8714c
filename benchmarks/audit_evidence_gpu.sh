#!/usr/bin/env bash
# Issues 19 and 22.1 on the GPU machine, one call (about 8-12 minutes on an H100/H200):
#   - the cuda zoo's new cases (the profiler-flag, caller's-stack, time-between-calls and
#     stop-the-profiler tricks; the sandbox escape) and the existing ones, with the audit now
#     over every timed call: tests/test_gpu.py -k "zoo";
#   - the escape case under real Nsight Compute inside the sandbox, and the audit's pieces:
#     tests/test_profile_sandbox.py, tests/test_audit_timed.py;
#   - the audit's cost: benchmarks/audit_overhead.py --device cuda (honest kernels, audit on
#     and off interleaved; verdicts must be unchanged, median verify-time ratio <= 1.2).
# Writes under $OUT: device.txt, gpu_zoo.log, audit_tests.log, audit_overhead.{md,json}.
set -uo pipefail
OUT=${OUT:-/tmp/assay-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
export ASSAY_KERNEL_CACHE=${ASSAY_KERNEL_CACHE:-/tmp/assay-kernels}
{
  date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda)'
  command -v ncu && ncu --version | tail -1
} 2>&1 | tee "$OUT/device.txt"
rc=0
python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k "zoo" 2>&1 \
  | tail -40 | tee "$OUT/gpu_zoo.log" || rc=1
python3 -m pytest -q -p no:cacheprovider tests/test_profile_sandbox.py tests/test_audit_timed.py \
  2>&1 | tail -30 | tee "$OUT/audit_tests.log" || rc=1
python3 benchmarks/audit_overhead.py --device cuda --repeat ${REPEAT:-5} --out "$OUT" || rc=1
exit $rc
