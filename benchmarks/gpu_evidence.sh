#!/usr/bin/env bash
# One call on the GPU machine (torch 2.11+cu130 there): GPU tests, then the CI campaign on the
# cuda target at H100 sizes up to `profile`. Results come back under $OUT; track, export and
# report then run on the CPU machine (mlflow and polars stay off the GPU machine).
#   wheels: `python3 benchmarks/device_wheels.py --pipeline` into .whl/ (carried)
set -uo pipefail
OUT=${OUT:-/tmp/assay-out}
mkdir -p "$OUT"
. benchmarks/device_env.sh "$OUT/device.txt" || exit 1

python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py -s 2>&1 | tee "$OUT/gpu_tests.log"

CAMPAIGN=${CAMPAIGN:-gpu-ci}
time timeout ${SNAKEMAKE_TIMEOUT:-450} python3 -m snakemake --cores 8 --resources gpu=1 --until profile \
  --config "overrides=[campaign=$CAMPAIGN,tasks=ci,tasks.size=${SIZE:-small},evolve=ci,target=cuda]" \
  2>&1 | tail -40 | tee "$OUT/snakemake.log"
tar czf "$OUT/results.tgz" results/$CAMPAIGN
python3 - "$CAMPAIGN" <<'PY' | tee "$OUT/summary.txt"
import json, sys, glob
c = sys.argv[1]
for p in sorted(glob.glob(f"results/{c}/*/*/gen_*/verdicts/*.json")):
    v = json.load(open(p))
    parts = p.split("/")
    sp = f"{v['speedup_eager']:.2f}x" if v.get("speedup_eager") else "-"
    spc = f"{v['speedup_compile']:.2f}x" if v.get("speedup_compile") else "-"
    rt = f"{v['runtime_ms']:.4f}" if v.get("runtime_ms") else "-"
    print(f"{parts[3]:22s} {parts[4]} {v['candidate']} {'ACCEPT' if v['accepted'] else 'reject'} "
          f"runtime_ms={rt} eager={sp} compile={spc} roofline_ms={v.get('roofline_ms')} "
          f"reasons={','.join(v['reasons'])}")
PY
