#!/usr/bin/env bash
# Issue #8's multi-GPU acceptance, one call on a machine with 2+ GPUs: the campaign with
# `--resources gpu=2` (local-multigpu profile, target=cuda, the CI tasks, a longer evolution)
# while nvidia-smi samples every GPU each 500 ms; then a summary of which device each GPU job
# leased (the "GPU lease: device N" line of its step log), when, and how long both GPUs were busy
# at once. Everything lands under $OUT:
#   device.txt, snakemake.log, nvidia-smi.csv, nvidia-smi-apps.csv, leases.tsv, summary.txt,
#   results.tgz (the campaign's tree; track/export/report can run elsewhere on it).
#
#   bash benchmarks/multigpu_evidence.sh
# Env: OUT (default /tmp/assay-out), GPUS (2), CAMPAIGN (gpu-multi), TASKS (ci), SIZE (small),
#   GENERATIONS (4), CHILDREN (4), SNAKEMAKE_TIMEOUT (480 s).
# Like gpu_evidence.sh: wheels in .whl/ (snakemake, hydra-core, omegaconf and their missing
# deps) are installed to /tmp/site when present; the machine's python3 brings torch.
set -uo pipefail
OUT=${OUT:-/tmp/assay-out}
mkdir -p "$OUT"
GPUS=${GPUS:-2}
CAMPAIGN=${CAMPAIGN:-gpu-multi}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
# assay from this checkout (the local-multigpu profile imports assay.gpu to count the GPUs).
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD/src
export PYTHONUNBUFFERED=1
export ASSAY_KERNEL_CACHE=${ASSAY_KERNEL_CACHE:-/tmp/assay-kernels}
export ASSAY_GPU_LOCK_DIR=${ASSAY_GPU_LOCK_DIR:-/tmp/assay-gpu-$CAMPAIGN}

{
  date -u
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__, torch.version.cuda, "devices", torch.cuda.device_count())'
} 2>&1 | tee "$OUT/device.txt"
have=$(nvidia-smi -L | grep -c '^GPU ')
if (( have < GPUS )); then
  echo "multigpu_evidence.sh: blocked: $have GPU(s) here, $GPUS needed" | tee "$OUT/summary.txt"
  exit 3
fi

# Samples of every GPU (utilization, memory) and of the processes on them, every 500 ms.
nvidia-smi --query-gpu=timestamp,index,utilization.gpu,memory.used --format=csv,nounits -lms 500 \
  >"$OUT/nvidia-smi.csv" 2>&1 &
smi_pid=$!
nvidia-smi --query-compute-apps=timestamp,gpu_uuid,pid,used_memory --format=csv,nounits -lms 500 \
  >"$OUT/nvidia-smi-apps.csv" 2>&1 &
apps_pid=$!
trap 'kill "$smi_pid" "$apps_pid" 2>/dev/null' EXIT

overrides="campaign=$CAMPAIGN,tasks=${TASKS:-ci},tasks.size=${SIZE:-small},evolve=ci"
overrides+=",evolve.generations=${GENERATIONS:-4},evolve.children=${CHILDREN:-4},target=cuda"
start=$(date +%s)
timeout "${SNAKEMAKE_TIMEOUT:-480}" python3 -m snakemake --workflow-profile local-multigpu \
  --resources gpu="$GPUS" --until profile --config "overrides=[$overrides]" \
  >"$OUT/snakemake.log" 2>&1
rc=$?
echo "snakemake exit $rc after $(( $(date +%s) - start )) s" | tee -a "$OUT/device.txt"
sleep 1
kill "$smi_pid" "$apps_pid" 2>/dev/null
tail -5 "$OUT/snakemake.log"
tar czf "$OUT/results.tgz" "results/$CAMPAIGN" 2>/dev/null

python3 - "$CAMPAIGN" "$OUT" <<'PY' | tee "$OUT/summary.txt"
import csv, datetime as dt, glob, os, re, sys
from collections import Counter, defaultdict

campaign, out = sys.argv[1], sys.argv[2]
# Per GPU job: the device it leased, when (the log line), and its end (the log's last write).
lease = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ assay: GPU lease: device (\S+)")
jobs = []
for path in sorted(glob.glob(f"results/{campaign}/logs/**/*.log", recursive=True)):
    with open(path) as f:
        for line in f:
            m = lease.match(line)
            if m:
                t0 = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
                jobs.append((t0, os.path.getmtime(path), m.group(2),
                             os.path.relpath(path, f"results/{campaign}/logs")))
                break
with open(f"{out}/leases.tsv", "w") as f:
    f.write("start\tseconds\tdevice\tjob_log\n")
    for t0, t1, dev, name in sorted(jobs):
        f.write(f"{dt.datetime.fromtimestamp(t0):%H:%M:%S}\t{t1 - t0:.0f}\t{dev}\t{name}\n")
per_dev = Counter(dev for _, _, dev, _ in jobs)
print(f"GPU jobs with a lease: {len(jobs)}; per device: {dict(sorted(per_dev.items()))}")
by_rule = defaultdict(Counter)
for _, _, dev, name in jobs:
    by_rule[name.split("/")[0]][dev] += 1
for rule, c in sorted(by_rule.items()):
    print(f"  {rule:9s} {dict(sorted(c.items()))}")

# Seconds during which jobs held two different devices at once (1 s steps).
if jobs:
    lo, hi = int(min(j[0] for j in jobs)), int(max(j[1] for j in jobs)) + 1
    both = span = 0
    for t in range(lo, hi):
        devs = {dev for t0, t1, dev, _ in jobs if t0 <= t < t1}
        span += bool(devs)
        both += len(devs) >= 2
    print(f"seconds with a GPU job running: {span}; with 2+ devices leased at once: {both} "
          f"({100 * both / max(span, 1):.0f}%)")

# nvidia-smi samples: per GPU, samples with utilization > 0; samples where all were busy at once.
util = defaultdict(dict)
try:
    with open(f"{out}/nvidia-smi.csv") as f:
        for row in csv.reader(f):
            if len(row) < 4 or not row[1].strip().isdigit():
                continue
            util[row[0].strip()[:21]][row[1].strip()] = (float(row[2]), float(row[3]))
except FileNotFoundError:
    pass
if util:
    devs = sorted({d for s in util.values() for d in s})
    print(f"nvidia-smi: {len(util)} samples (500 ms) of GPUs {devs}")
    for d in devs:
        busy = sum(1 for s in util.values() if s.get(d, (0, 0))[0] > 0)
        peak = max(s.get(d, (0, 0))[1] for s in util.values())
        print(f"  GPU {d}: utilization > 0 in {busy} samples, peak memory {peak:.0f} MiB")
    busy_both = sum(1 for s in util.values() if sum(v[0] > 0 for v in s.values()) >= 2)
    print(f"  samples with 2+ GPUs at utilization > 0: {busy_both}")
apps = Counter()
try:
    with open(f"{out}/nvidia-smi-apps.csv") as f:
        for row in csv.reader(f):
            if len(row) >= 3 and row[2].strip().isdigit():
                apps[row[1].strip()] += 1
    print(f"nvidia-smi compute-app samples per GPU uuid: {dict(apps)}")
except FileNotFoundError:
    pass
PY
exit $rc
