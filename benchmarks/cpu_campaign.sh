#!/usr/bin/env bash
# Issue 18's cpu acceptance on a quiet machine, in one call: the default campaign on the cpu
# target confined to 2 cores (taskset), timed, with its fast_1 and geomean over eager (the
# definitions of `assay compare`: best accepted kernel per task; fast_1 over the tasks tried,
# geomean over the tasks with an accepted kernel); then the same cpu kernel verified five times
# (tests/test_cpu_reproducible.py). Writes $OUT/cpu_campaign.md, $OUT/cpu_campaign.json, the
# logs and $OUT/results.tgz.
#   OUT=/tmp/out bash benchmarks/cpu_campaign.sh                  # the whole campaign
#   CORES=0,1 UNTIL=profile TASKS='[L1_1_ReLU,L1_5_Swish]' bash benchmarks/cpu_campaign.sh
# UNTIL=profile (the default where mlflow is not importable, e.g. the GPU machine) stops before
# track/export/report, which take ~25 s on 2 cores; on a machine with the `pipeline` extra the
# campaign runs to its report, as `make run` does. Wheels in .whl/ (carried) are installed
# first when present.
set -uo pipefail
OUT=${OUT:-/tmp/assay-out}
CORES=${CORES:-0,1}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 CUDA_VISIBLE_DEVICES=""
# A first run: empty kernel and inductor caches, a lease folder of its own, a fresh results/.
SCRATCH=$(mktemp -d)
export ASSAY_KERNEL_CACHE=$SCRATCH/kernels TORCHINDUCTOR_CACHE_DIR=$SCRATCH/inductor \
  ASSAY_GPU_LOCK_DIR=$SCRATCH/locks
RESULTS=$SCRATCH/results
if [ -z "${UNTIL:-}" ] && ! python3 -c 'import mlflow, polars' 2>/dev/null; then UNTIL=profile; fi
OVR="campaign=default,target=cpu,results_dir=$RESULTS${TASKS:+,tasks.include=$TASKS}"
{
  date -u; uname -m; nproc; taskset -c "$CORES" nproc; uptime
  grep -m1 'model name' /proc/cpuinfo
  python3 -c 'import torch; print("torch", torch.__version__)'
  g++ --version | head -1; ldd --version | head -1
} 2>&1 | tee "$OUT/machine.txt"

start=$(date +%s)
taskset -c "$CORES" python3 -m snakemake --cores 2 ${UNTIL:+--until "$UNTIL"} \
  --config "overrides=[$OVR]" > "$OUT/snakemake.log" 2>&1
rc=$?
wall=$(( $(date +%s) - start ))
echo "snakemake exit $rc, wall $wall s" | tee -a "$OUT/machine.txt"
tar czf "$OUT/results.tgz" -C "$SCRATCH" results

python3 - "$RESULTS/default" "$wall" "$rc" "$OUT" "${UNTIL:-report}" <<'PY'
import glob, json, math, os, sys
root, wall, rc, out, until = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = []
for task_dir in sorted(glob.glob(f"{root}/offline/*/")):
    task = os.path.basename(task_dir.rstrip("/"))
    if not glob.glob(f"{task_dir}gen_*/proposals.json"):
        continue  # not tried
    verdicts = [json.load(open(p)) for p in glob.glob(f"{task_dir}gen_*/verdicts/*.json")]
    ok = [v for v in verdicts if v.get("accepted") and v.get("speedup_eager")]
    best = max(ok, key=lambda v: v["speedup_eager"]) if ok else None
    base = json.load(open(f"{root}/baselines/{task}.json"))
    rows.append({"task": task, "verified": len(verdicts), "accepted": len(ok),
                 "eager_ms": base.get("eager_ms"), "eager_iqr_ms": base.get("eager_iqr_ms"),
                 "best_ms": best["runtime_ms"] if best else None,
                 "speedup_eager": best["speedup_eager"] if best else None,
                 "speedup_compile": best.get("speedup_compile") if best else None})
acc = [r["speedup_eager"] for r in rows if r["speedup_eager"]]
summary = {"wall_s": wall, "snakemake_exit": rc, "until": until, "tried": len(rows),
           "accepted": len(acc),
           "fast_1": sum(s > 1 for s in acc) / len(rows) if rows else None,
           "geomean_speedup_accepted": math.exp(sum(map(math.log, acc)) / len(acc)) if acc else None}
json.dump({"summary": summary, "tasks": rows}, open(f"{out}/cpu_campaign.json", "w"), indent=1)
fmt = lambda v, f: "-" if v is None else format(v, f)
lines = [f"- wall {wall} s ({wall / 60:.1f} min) to `{until}`, snakemake exit {rc}",
         f"- tried {summary['tried']}, accepted {summary['accepted']}, fast_1 "
         f"{fmt(summary['fast_1'] and 100 * summary['fast_1'], '.1f')}%, geomean over eager "
         f"{fmt(summary['geomean_speedup_accepted'], '.3f')}x", "",
         "| task | verified | accepted | eager ms (IQR) | best ms | x eager | x compile |",
         "|---|---|---|---|---|---|---|"]
for r in rows:
    lines.append(f"| {r['task']} | {r['verified']} | {r['accepted']} | {fmt(r['eager_ms'], '.4g')} "
                 f"({fmt(r['eager_iqr_ms'], '.2g')}) | {fmt(r['best_ms'], '.4g')} | "
                 f"{fmt(r['speedup_eager'], '.2f')} | {fmt(r['speedup_compile'], '.2f')} |")
open(f"{out}/cpu_campaign.md", "w").write("\n".join(lines) + "\n")
print("\n".join(lines[:2]))
PY

ASSAY_STRICT_TIMING=1 taskset -c "$CORES" python3 -m pytest -m slow -q -p no:cacheprovider \
  tests/test_cpu_reproducible.py 2>&1 | tail -15 | tee "$OUT/reproducible.log"
