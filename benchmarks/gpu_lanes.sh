#!/usr/bin/env bash
# Several gpu_phases.sh runs side by side on a machine of several GPUs, each on its own GPUs (a
# lane), so one device call does the work of several: device time counts the machine's held
# time, not its GPUs.
#   bash benchmarks/gpu_lanes.sh "0: PARTS=synth-triton triton:480" \
#        "1: ZOO_TRANSFER=cuda_ipc XDIST=4 gputests:300 verify1:150" "2,3: selfcheck:480"
# Each lane is "GPU ids: [NAME=value ...] phase:seconds ...": its environment words first, then
# gpu_phases.sh's phases, run with CUDA_VISIBLE_DEVICES set to the lane's GPUs. The lanes share
# gpu_phases.sh's state folder (each phase writes its own files); every lane's output goes to
# $STATE/lane-<ids>.log, and one $OUT/state.tgz comes back when all have ended. Sandboxed
# workers are cleaned up once, at the end (a lane never kills another's). Host memory is shared:
# ASSAY_HOST_SHARE is the machine's GPU count unless set. Two lanes must not run the same phase
# (they would share its folder), except triton with other PARTS and synthkb with other KERNELS;
# a phase over several GPUs takes them in one lane ("1,2: selfcheck:480").
set -uo pipefail
[ $# -gt 0 ] || { echo "usage: gpu_lanes.sh \"IDS: [NAME=value ...] phase:secs ...\" ..." >&2; exit 2; }
for lane in "$@"; do  # every lane well formed before any starts
  [[ $lane =~ ^[0-9]+(,[0-9]+)*:.*[a-z0-9]+:[0-9]+ ]] || {
    echo "gpu_lanes.sh: lane '$lane': expected 'GPU ids: [NAME=value ...] phase:seconds ...'" >&2
    exit 2; }
done
. benchmarks/device_state.sh || exit 1  # $OUT, $S; the wheels once, before the lanes
export ASSAY_HOST_SHARE=${ASSAY_HOST_SHARE:-$(nvidia-smi -L | wc -l)}
logs=()
for lane in "$@"; do
  ids=${lane%%:*}; words=${lane#*:}
  env_words=(); phases=()
  for w in $words; do
    if [[ $w == *=* ]]; then env_words+=("$w"); else phases+=("$w"); fi
  done
  log="$S/lane-${ids//,/_}.log"; logs+=("$log")  # (a restored state holds older ones)
  echo "lane $ids: ${env_words[*]} ${phases[*]} -> $log"
  env "${env_words[@]}" CUDA_VISIBLE_DEVICES="$ids" LANE=1 SHARED_RUN=1 STATE="$S" OUT="$OUT" \
    bash benchmarks/gpu_phases.sh "${phases[@]}" > "$log" 2>&1 &
done
wait
pkill -9 -f "assay.verify.sandbox" 2>/dev/null
for log in "${logs[@]}"; do echo "=== $log"; tail -40 "$log"; done
tar czf "$OUT/state.tgz" -C "$S" . && ls -la "$OUT"
