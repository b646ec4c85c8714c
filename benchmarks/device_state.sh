# Sourced by gpu_phases.sh and gpu_lanes.sh:
#   . benchmarks/device_state.sh || exit 1
# sets $OUT (what comes back from the device call) and $S (the phases' state: kept while the
# machine is warm; on a fresh machine restored from a carried .dev/state.tgz), then sources
# device_env.sh (the wheels, PYTHONPATH, the device's lines appended to $S/device.txt); the
# baseline cache lives in the state ($S/baseline-cache).
OUT=${OUT:-/tmp/assay-out}
S=${STATE:-/tmp/assay-state}
mkdir -p "$OUT"
if [ ! -d "$S" ] && [ -f .dev/state.tgz ]; then mkdir -p "$S" && tar xzf .dev/state.tgz -C "$S"; fi
mkdir -p "$S"
# baselines and task records cached per (task, GPU, torch version) in the state, so a later
# session's fresh machine finds those an earlier one timed (the verify step's baseline of this
# GPU, where the campaign's was timed on another, among them)
export ASSAY_BASELINE_CACHE=${ASSAY_BASELINE_CACHE:-$S/baseline-cache}
. benchmarks/device_env.sh "$S/device.txt"
