#!/usr/bin/env bash
# The SLURM path for real (issue #8): a one-node SLURM cluster on loopback (cluster.sh: Debian's
# slurm-wlm + munge, slurmctld + slurmd, CPU jobs), the CI campaign through the slurm workflow
# profile (every job an sbatch job) and, at the same time, the same campaign run locally; then
#   - compare_archives.py: generation 0 identical (the offline synthesizer is deterministic from
#     the seed), every candidate found in both archives identical (code, verdict correctness,
#     lineage), the same number of candidates per task and generation;
#   - replay_evolve.py: every evolve job that ran on SLURM, replayed here on the same input
#     files, proposes the same candidates (generations >= 1 pick parents by measured speedup,
#     so two runs may breed different children on any executor; the steps must not differ).
# Stops the daemons at the end.
#
#   sudo PYTHON=/path/to/venv/bin/python benchmarks/slurm/run_slurm_campaign.sh [WORK_DIR]
#
# Needs root (apt-get, slurmd), and PYTHON with assay, snakemake and the slurm executor plugin
# (`pip install -e '.[pipeline]'`). Env: OUT (summary folder, default WORK_DIR/out),
# OVERRIDES (default campaign=ci,tasks=ci,evolve=ci,target=cpu: this cluster has no GPU, and
# target=cpu makes the GPU rules ask for none), LOCAL_RUN=0 skips the local run and the checks.
# Exit status 0 when both runs finish and the checks pass.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
PYTHON=${PYTHON:-$(command -v python3)}
work=${1:-$(mktemp -d /tmp/assay-slurm.XXXXXX)}
mkdir -p "$work"
work=$(cd "$work" && pwd)
OUT=${OUT:-$work/out}
mkdir -p "$OUT"
overrides=${OVERRIDES:-campaign=ci,tasks=ci,evolve=ci,target=cpu}
campaign=$(sed -n 's/.*campaign=\([^,]*\).*/\1/p' <<<"$overrides")
campaign=${campaign:-default}
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$OUT/run.log" >&2; }

"$PYTHON" -c 'import assay, snakemake, snakemake_executor_plugin_slurm, polars' || {
  echo "run_slurm_campaign.sh: $PYTHON lacks assay, snakemake, the slurm plugin or polars" >&2
  exit 2
}
# The rules call the interpreter running Snakemake; SLURM jobs inherit this environment
# (sbatch --export=ALL), so the jobs on this node find the same python.
export PATH="$(dirname "$PYTHON"):$PATH"
export ASSAY_KERNEL_CACHE=${ASSAY_KERNEL_CACHE:-$work/kernel-cache}

t0=$(date +%s)
log "cluster: starting in $work/cluster"
bash "$here/cluster.sh" start "$work/cluster" >/dev/null
local_pid=""
cleanup() {
  [[ -n $local_pid ]] && kill "$local_pid" 2>/dev/null
  bash "$here/cluster.sh" stop "$work/cluster"
  log "cluster: stopped"
}
trap cleanup EXIT
export SLURM_CONF=$work/cluster/slurm.conf
sinfo | tee "$OUT/sinfo.txt" >&2
log "cluster: idle after $(( $(date +%s) - t0 )) s"

local_rc=0 local_s=0
if [[ ${LOCAL_RUN:-1} != 0 ]]; then
  local_cmd=("$PYTHON" -m snakemake --snakefile "$repo/Snakefile" --directory "$work/local"
    --workflow-profile "$repo/workflow/profiles/default" --cores 2 --config "overrides=[$overrides]")
  log "local run (in the background): ${local_cmd[*]}"
  t2=$(date +%s)
  "${local_cmd[@]}" >"$OUT/snakemake-local.log" 2>&1 &
  local_pid=$!
fi

# The slurm profile as committed; partition and account come from the environment.
export ASSAY_SLURM_PARTITION=${SLURM_PARTITION:-assay} ASSAY_SLURM_ACCOUNT=
slurm_cmd=("$PYTHON" -m snakemake --snakefile "$repo/Snakefile" --directory "$work/slurm"
  --workflow-profile "$repo/workflow/profiles/slurm" --config "overrides=[$overrides]"
  # This cluster keeps no accounting database: poll squeue, and poll often (the default first
  # check after 40 s costs minutes on a 10-level DAG of short jobs).
  --slurm-status-command squeue --slurm-init-seconds-before-status-checks 2
  --seconds-between-status-checks 2 --slurm-keep-successful-logs)
log "slurm run: ${slurm_cmd[*]}"
t1=$(date +%s)
slurm_rc=0
"${slurm_cmd[@]}" >"$OUT/snakemake-slurm.log" 2>&1 || slurm_rc=$?
slurm_s=$(( $(date +%s) - t1 ))
log "slurm run: exit $slurm_rc in $slurm_s s"
# Every SLURM job of the run (finished jobs stay listed for MinJobAge): id, state, the rule.
squeue -h -t all -o '%i|%T|%k' | sort -n >"$OUT/slurm-jobs.txt" || true
scontrol -o show job >"$OUT/slurm-jobs-detail.txt" 2>&1 || true

if [[ -n $local_pid ]]; then
  wait "$local_pid" || local_rc=$?
  local_pid=""
  local_s=$(( $(stat -c %Y "$OUT/snakemake-local.log") - t2 ))  # its last line: when it ended
  log "local run: exit $local_rc in $local_s s"
fi

checks_rc=0
{
  echo "# SLURM run of the '$campaign' campaign"
  echo
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- machine: $(uname -srm), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); $(. /etc/os-release && echo "$PRETTY_NAME"); load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "- slurm: $(sinfo -V), one node on loopback (benchmarks/slurm/cluster.sh); munge $(munged -V 2>&1 | awk '{print $2}' | head -1)"
  echo "- python: $("$PYTHON" -c 'import sys, importlib.metadata as m; print(sys.version.split()[0], "snakemake", m.version("snakemake"), "plugin-slurm", m.version("snakemake-executor-plugin-slurm"), "jobstep", m.version("snakemake-executor-plugin-slurm-jobstep"))')"
  echo "- overrides: $overrides"
  echo "- slurm run: exit $slurm_rc, ${slurm_s} s; local run (at the same time, --cores 2): exit $local_rc, ${local_s} s"
  echo
  echo "SLURM jobs of the run by rule, as the cluster recorded them (scontrol show job):"
  echo
  "$PYTHON" - "$OUT/slurm-jobs-detail.txt" <<'PY'
import re, sys
from collections import defaultdict
rows = defaultdict(list)
for line in open(sys.argv[1]):
    f = dict(re.findall(r"(\w+)=(\S*)", line))
    if "JobId" not in f:
        continue
    rule = re.sub(r"^rule_", "", f.get("Comment", "?")).split("_wildcards")[0]
    gpus = f.get("TresPerJob") or f.get("TresPerNode") or "-"
    rows[rule].append((f.get("JobState"), f.get("Partition"), f.get("TimeLimit"),
                       f.get("MinMemoryNode", f.get("MinMemoryCPU", "-")), f.get("NumCPUs"), gpus))
print("| rule | jobs | state | partition | time limit | memory | CPUs | GPUs |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for rule, rs in sorted(rows.items()):
    cols = [sorted({str(r[i]) for r in rs}) for i in range(6)]
    print(f"| {rule} | {len(rs)} | " + " | ".join(", ".join(c) for c in cols) + " |")
print(f"\n{sum(map(len, rows.values()))} SLURM jobs")
PY
  echo
  if [[ ${LOCAL_RUN:-1} != 0 && $slurm_rc == 0 && $local_rc == 0 ]]; then
    for f in "$work/local/results/$campaign/archive/"level_*.parquet; do
      echo "## Archive $(basename "$f"), local vs slurm (compare_archives.py)"
      echo
      "$PYTHON" "$here/compare_archives.py" "$f" \
        "$work/slurm/results/$campaign/archive/$(basename "$f")" || checks_rc=1
      echo
    done
    echo "## The evolve jobs that ran on SLURM, replayed locally (replay_evolve.py)"
    echo
    echo '```'
    "$PYTHON" "$here/replay_evolve.py" "$work/slurm" "$overrides" || checks_rc=1
    echo '```'
  fi
} >"$OUT/summary.md" 2>&1
cat "$OUT/summary.md"
[[ $slurm_rc == 0 ]] || { tail -40 "$OUT/snakemake-slurm.log" >&2; exit 1; }
[[ $local_rc == 0 ]] || { tail -40 "$OUT/snakemake-local.log" >&2; exit 1; }
exit $checks_rc
