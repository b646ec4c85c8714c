#!/usr/bin/env bash
# Issue #20's GPU evidence (target=triton), one call on the GPU machine with its own torch and
# Triton; results under $OUT for docs/evidence/:
#   1. the Triton cases of the cuda zoo through the verifier (honest accepted, exploits rejected)
#   2. the offline synthesizer on the bundled suite, Triton forms then CUDA forms (same device):
#      accepted share, geomean over eager and torch.compile (summary.md of each)
#   3. the CI campaign with target=triton and with target=cuda, one report comparing them
#   4. with KB=/path/to/KernelBench/KernelBench/level1: the same pair of campaigns on its first
#      ${KB_LIMIT:-20} tasks
#   wheels: `python3 benchmarks/device_wheels.py --pipeline` into .whl/ (carried)
# PARTS: the parts to run (spaces or commas), of "zoo synth-triton synth-cuda campaigns"
# (campaign-triton / campaign-cuda: one of the two) (default: all, in that order); the lanes of
# gpu_lanes.sh can take different parts on different GPUs.
set -uo pipefail
OUT=${OUT:-/tmp/assay-out}
mkdir -p "$OUT"
. benchmarks/device_env.sh "$OUT/device.txt" || exit 1

PARTS=" $(echo ${PARTS:-zoo synth-triton synth-cuda campaigns} | tr , " ") "
part() { [[ $PARTS == *" $1 "* ]]; }

part zoo && python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -k triton -s 2>&1 \
  | tee "$OUT/triton_zoo.log"

part synth-triton && python3 benchmarks/synth_suite.py --kernels triton --out "$OUT/synth-triton" \
  2>&1 | tail -30
part synth-cuda && python3 benchmarks/synth_suite.py --out "$OUT/synth-cuda" 2>&1 | tail -30
part campaigns || part campaign-triton || part campaign-cuda || exit 0

campaign() {  # name, then overrides; its results/ folder back as $OUT/results-<name>.tgz
  local name=$1; shift
  # --nolock: campaigns of other names write disjoint results/ folders, so two lanes may run
  # theirs at once in one checkout
  timeout ${SNAKEMAKE_TIMEOUT:-500} python3 -m snakemake --cores 8 --resources gpu=1 --nolock \
    --until profile --config "overrides=[campaign=$name,$(IFS=,; echo "$*")]" 2>&1 \
    | tee "$OUT/snakemake-$name.log" | tail -20
  tar czf "$OUT/results-$name.tgz" "results/$name"
}
# campaign-triton / campaign-cuda: one of the pair (two lanes), campaigns: both, one after the other
{ part campaigns || part campaign-triton; } && campaign ci-triton tasks=ci evolve=ci target=triton
{ part campaigns || part campaign-cuda; } && campaign ci-cuda tasks=ci evolve=ci target=cuda
if [ -n "${KB:-}" ]; then
  campaign kb-triton tasks=kernelbench "tasks.source=$KB" "tasks.limit=${KB_LIMIT:-20}" target=triton
  campaign kb-cuda tasks=kernelbench "tasks.source=$KB" "tasks.limit=${KB_LIMIT:-20}" target=cuda
fi
# track, export and report run on the CPU machine (mlflow and polars stay off the GPU machine):
#   assay report ci-triton --compare-with ci-cuda   (and kb-triton --compare-with kb-cuda)
