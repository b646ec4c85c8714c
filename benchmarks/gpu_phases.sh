#!/usr/bin/env bash
# GPU work longer than one device call, in phases that resume: bash benchmarks/gpu_phases.sh
# PHASE:SECONDS ...  Each phase runs in its own process group, killed with everything it started
# after SECONDS; its results live in /tmp/assay-state (kept between calls while the machine is
# warm) and come back as $OUT/state.tgz after every call. On a fresh machine the state is
# restored from a carried .dev/state.tgz (copy the last one there and carry .dev).
#   selfcheck   KernelBench's reference self-check (issue #16), --resume; the first time, seeded
#               from SELFCHECK_SEED (JSONL files, later rows win: e.g. the evidence folders');
#               RETRY: the row statuses to redo (default: error; also rejected, too_large,
#               degenerate, accepted), ONLY: task-id globs, JOBS: tasks in flight per GPU (3); on a
#               machine of several GPUs, one shard of the tasks per GPU (--shard k/N)
#   redteam     the red-team generator on cuda (issue #19), resumes from its results.jsonl;
#               RT_ONLY: variants whose id holds one of these (commas), WORKERS (5 per GPU)
#   gputests    pytest -m gpu $FILES (default tests/test_gpu.py: the cuda zoo, Triton cases
#               included; the synthesizer's families: FILES="tests/test_offline*.py"), K: -k,
#               XDIST: pytest-xdist workers (default: one per GPU where there are several);
#               (on a machine that lacks it, carry its wheels: `pip download --no-deps -d .whl
#               pytest-xdist==3.8.0 execnet==2.1.2`; four on one H100 ran 60 tests in 118 s)
#               ZOO_TRANSFER=host: the zoo with the worker's data in shared host memory,
#               cuda_ipc: copied through device memory (the default is verify.transfer's, draw)
#   audit       benchmarks/audit_overhead.py --device cuda (issue #19's last line)
#   triton      benchmarks/triton_evidence.sh (issue #20); PARTS: which of its parts (default all)
#   streams     benchmarks/probe_streams.py on PROBE (KernelBench task files; default L2_19 and
#               L2_34): the streams each reference's kernels run on, as the audit sees them
#   inline      benchmarks/inline_build.py (issue #16: a load_inline candidate's cold build per
#               idea, assay's cache cold and warm), REPEAT builds per variant (default 1),
#               BUILDS: the variants (default all), into $S/inline$TAG
#   batch       benchmarks/verify_batch.py on .kb (issue #16: candidates per GPU-hour, batch
#               against a sequential `assay verify` loop); PROBLEMS: level-1 task numbers,
#               SAMPLES per task (3), SEQUENTIAL candidates in the loop (2)
#   verify1     `assay verify` of one generated load_inline candidate of KB's level-1 PROBLEM (21:
#               Sigmoid, 6.4 GB tensors) once per word of TRANSFERS (default: draw draw;
#               SECONDS each: cold, then warm), the verdicts with their
#               `times` in $S/verify1/<n>-<transfer>.json (issue #16's single-verification line)
#   synthkb     the offline synthesizer on KernelBench (issue #17), resumable; LEVELS=1,
#               VARIANTS / MUTATIONS (synth_suite's defaults), TASKS: id globs, SAMPLE: tasks
#               per level (seeded), LIMIT: undecided tasks taken per call; KERNELS=triton: the
#               Triton forms, into $S/synthkb-triton; KNOBS (e.g. phases=0): each template's
#               defaults with these knobs too, where its space has them (an A/B of a knob),
#               into $S/synthkb-phases_0
#   dag         the campaign's Snakemake DAG with tasks=kernelbench on .kb (issue #16) up to
#               profile, resumable (results in $S/dag), GPU_JOBS jobs per GPU (3: steps do
#               most of their work before taking the device, so one uses it while two get
#               ready; the twelfth session held it 84% of its DAG time with 3, the eleventh
#               66% with 2; benchmarks/dag_left.py); LEVELS (1), CAMPAIGN (kb),
#               CORES (12), TASKS: ids (all),
#               NCU_MIN: profile.ncu_min_speedup (1: ncu for the kernels faster than eager only,
#               from the eleventh session on; 5-40 s of the device a task), PREWARM:
#               baselines.prewarm (true, the default since the eleventh session), FORCE:
#               files (under $S/dag) or rules made again with what depends on them (a task's
#               gen_0/proposals.json: all its stages, as `assay run --rerun` forces them);
#               ends with the call's jobs per rule (benchmarks/dag_times.py)
#   retime      benchmarks/kb_retime.py: the DAG's ($S/dag, CAMPAIGN) baselines of another GPU timed
#               again on this one, into the baseline cache (kb_baselines.py --cache reads it);
#               JOBS in flight (3), ONLY: task-id globs; resumes (a cached task is skipped);
#               NORMS=1: also the tasks with a norm, whatever GPU timed them (their baselines
#               may predate instantiate.task_mode)
#   joins       benchmarks/probe_joins.py: the stream waits the audit sees of a joined side
#               stream (issue #19)
#   prewarm     benchmarks/probe_compile_prewarm.py on PROBE (task files; default KernelBench's
#               L2_34, L3_45 UNetSoftmax, L3_16 DenseNet201: the quick ones first; 150 s did
#               not see DenseNet201 through): can torch.compile's compile fill
#               its caches with fake tensors, no CUDA context, before a step takes the device
#               (issue #16), into $S/prewarm.json
# Needs: the wheels in .whl/ (`python3 benchmarks/device_wheels.py`, with --pipeline for the
# triton phase's campaigns: snakemake's closure, ~29 MiB) and KernelBench in .kb/ (a copy of
# ../shared/kernelbench), both carried. Example, two calls on one warm machine:
#   bash benchmarks/gpu_phases.sh selfcheck:540      then      bash benchmarks/gpu_phases.sh redteam:540
set -uo pipefail
. benchmarks/device_state.sh || exit 1  # $OUT, $S (restored), the wheels
echo "phases: $*" | tee -a "$S/device.txt"
# the GPUs this run may use: CUDA_VISIBLE_DEVICES where set (a lane of gpu_lanes.sh), else every
# one; several: the phases spread over them (selfcheck, redteam, gputests)
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then IFS=, read -ra gpu_ids <<< "$CUDA_VISIBLE_DEVICES"
else mapfile -t gpu_ids < <(seq 0 $(( $(nvidia-smi -L | wc -l) - 1 ))); fi
gpus=${#gpu_ids[@]}

# run_for SECONDS LOG CMD...: CMD in its own process group, killed with it after SECONDS
run_for() {
  local secs=$1 log=$2 t=0; shift 2
  set -m; ( "$@" ) >>"$log" 2>&1 & local pid=$!; set +m
  while kill -0 "$pid" 2>/dev/null; do
    sleep 2; t=$((t + 2))
    if [ "$t" -ge "$secs" ]; then
      echo "[gpu_phases] stopped at ${secs}s" >>"$log"
      kill -- -"$pid" 2>/dev/null; sleep 3; kill -9 -- -"$pid" 2>/dev/null; break
    fi
  done
  wait "$pid" 2>/dev/null; local rc=$?
  # sandboxed workers run in sessions of their own (not while other shards still run theirs)
  [ -n "${SHARED_RUN:-}" ] || pkill -9 -f "assay.verify.sandbox" 2>/dev/null
  echo "[gpu_phases] rc=$rc after ${t}s" >>"$log"; tail -25 "$log"
}

for phase in "$@"; do
  name=${phase%%:*}; secs=${phase#*:}
  echo "=== $name ($secs s) $(date -u +%H:%M:%S)"
  case $name in
    selfcheck)
      mkdir -p "$S/selfcheck"
      if [ ! -f "$S/selfcheck/selfcheck.jsonl" ] && [ -n "${SELFCHECK_SEED:-}" ]; then
        cat $SELFCHECK_SEED > "$S/selfcheck/selfcheck.jsonl"
      fi
      selfcheck_args=(--source .kb --levels 1 2 3 --jobs "${JOBS:-3}" --device cuda
        --transfer ${TRANSFER:-draw} --resume --retry ${RETRY:-error} --budget-s "$secs" ${ONLY:+--only $ONLY})
      if [ "$gpus" -le 1 ]; then
        run_for $((secs + 40)) "$S/selfcheck.log" python3 benchmarks/kb_selfcheck.py \
          "${selfcheck_args[@]}" --out "$S/selfcheck"
      else  # one shard per GPU, each from the whole JSONL; their new rows appended after
        for k in $(seq 0 $((gpus - 1))); do
          d="$S/selfcheck-gpu$k"; mkdir -p "$d"; cp "$S/selfcheck/selfcheck.jsonl" "$d/" 2>/dev/null
          wc -l < "$d/selfcheck.jsonl" > "$d/seed_lines" 2>/dev/null || echo 0 > "$d/seed_lines"
          CUDA_VISIBLE_DEVICES=${gpu_ids[$k]} ASSAY_HOST_SHARE=${ASSAY_HOST_SHARE:-$gpus} SHARED_RUN=1 \
            run_for $((secs + 40)) "$S/selfcheck-gpu$k.log" \
            python3 benchmarks/kb_selfcheck.py "${selfcheck_args[@]}" --out "$d" \
            --shard "$k/$gpus" > /dev/null &
        done
        wait; [ -n "${LANE:-}" ] || pkill -9 -f "assay.verify.sandbox" 2>/dev/null
        for k in $(seq 0 $((gpus - 1))); do
          d="$S/selfcheck-gpu$k"
          # (a row torn by a kill gets its line ended: the next shard's rows start their own)
          tail -n +$(( $(cat "$d/seed_lines") + 1 )) "$d/selfcheck.jsonl" | sed -e '$a\' \
            >> "$S/selfcheck/selfcheck.jsonl"
          tail -4 "$S/selfcheck-gpu$k.log"
        done
        # the summary over every shard's rows (no task starts with no time left)
        python3 benchmarks/kb_selfcheck.py "${selfcheck_args[@]}" --budget-s 0 \
          --out "$S/selfcheck" 2>&1 | tail -3
      fi ;;
    redteam)
      run_for "$secs" "$S/redteam.log" python3 benchmarks/redteam.py --target cuda \
        --workers "${WORKERS:-$((5 * gpus))}" --gpus "$gpus" --out "$S/redteam" \
        ${RT_ONLY:+--only ${RT_ONLY//,/ }} ;;
    gputests)  # on several GPUs, one pytest-xdist worker per GPU (tests/conftest.py)
      spread=()
      [ "$gpus" -gt 1 ] && spread=(-n "$gpus")
      [ -n "${XDIST:-}" ] && spread=(-n "$XDIST")
      GPU_TESTS_SPREAD=$gpus run_for "$secs" "$S/gputests.log" python3 -m pytest -m gpu -v --tb=short \
        -p no:cacheprovider -rf "${spread[@]}" ${FILES:-tests/test_gpu.py} ${K:+-k "$K"} ;;
    audit)
      run_for "$secs" "$S/audit.log" python3 benchmarks/audit_overhead.py --device cuda \
        --repeat "${REPEAT:-3}" --out "$S/audit" ;;
    triton)
      tlog="$S/triton${PARTS:+-${PARTS//[ ,]/_}}.log"  # lanes with other PARTS: their own logs
      OUT=$S/triton run_for "$secs" "$tlog" bash benchmarks/triton_evidence.sh ;;
    synthkb)
      # a folder of its own per KERNELS and KNOBS (a rerun into one goes on where it stopped)
      skb="$S/synthkb${KERNELS:+-$KERNELS}${KNOBS:+-${KNOBS//[=,]/_}}"
      run_for "$secs" "$skb.log" python3 benchmarks/synth_suite.py \
        --source .kb ${KERNELS:+--kernels $KERNELS} --levels "${LEVELS:-1}" \
        --out "$skb" --budget-s $((secs - 60)) --grace-s 30 \
        ${VARIANTS:+--variants $VARIANTS} ${MUTATIONS:+--mutations $MUTATIONS} \
        ${TASKS:+--tasks "$TASKS"} ${SAMPLE:+--sample $SAMPLE} ${LIMIT:+--limit $LIMIT} \
        ${KNOBS:+--knobs "$KNOBS"} ;;
    inline)
      run_for "$secs" "$S/inline.log" python3 benchmarks/inline_build.py --repeat "${REPEAT:-1}" \
        ${BUILDS:+--variants $BUILDS} --out "$S/inline${TAG:-}" ;;
    batch)
      # (limit past the budget: the one sequential verification that starts may run over it)
      run_for $((secs + 60)) "$S/batch.log" python3 benchmarks/verify_batch.py --source .kb \
        --out "$S/batch" --samples "${SAMPLES:-3}" --sequential "${SEQUENTIAL:-2}" \
        --budget-s $((secs - 30)) ${PROBLEMS:+--problems $PROBLEMS} ;;
    verify1)
      mkdir -p "$S/verify1"
      python3 -c "import sys; sys.path.insert(0, 'benchmarks'); import verify_batch as v; \
        from pathlib import Path; v.write_candidates(Path('.kb'), Path('$S/verify1'), 1, \
        [${PROBLEM:-21}])" || exit 1
      cand=$(ls "$S"/verify1/level_1_problem_${PROBLEM:-21}_sample_0_kernel.py)
      task=$(ls .kb/level1/${PROBLEM:-21}_*.py)
      i=0  # (a transfer named twice: the second run finds the build and baselines cached)
      for tr in ${TRANSFERS:-draw draw}; do
        i=$((i + 1))
        run_for "$secs" "$S/verify1.log" python3 -m assay.cli verify --task "$task" \
          --candidate "$cand" --device cuda --transfer "$tr" --json "$S/verify1/$i-$tr.json"
      done ;;
    dag)  # the campaign's DAG on KernelBench (issue #16) up to profile, resumable: LEVELS
      # (default 1), CAMPAIGN (kb); its results/ in $S/dag (archive and report run on the
      # build machine from the returned state: polars and MLflow stay off the GPU machine)
      targets=(--until profile)  # TASKS: only these tasks' stages (their profile.json)
      tasks=${TASKS:-}; [ -n "${tasks//[[:space:]]/}" ] && targets=()
      for t in $tasks; do targets+=("$S/dag/${CAMPAIGN:-kb}/offline/$t/profile.json"); done
      run_for "$secs" "$S/dag.log" python3 -m snakemake "${targets[@]}" ${FORCE:+--forcerun $FORCE} \
        --cores "${CORES:-12}" --resources gpu=$((${GPU_JOBS:-3} * (gpus > 0 ? gpus : 1))) \
        --config "overrides=[campaign=${CAMPAIGN:-kb},tasks=kernelbench,tasks.source=$PWD/.kb,\
tasks.levels=[${LEVELS:-1}],target=cuda,results_dir=$S/dag,profile.ncu_min_speedup=${NCU_MIN:-1},\
baselines.prewarm=${PREWARM:-true}]"
      # this call's jobs per rule (the log's last invocation: this call started it)
      n=$(grep -c "^Building DAG of jobs" "$S/dag.log")
      python3 benchmarks/dag_times.py "$S/dag.log" --from-invocation "$n" ;;
    retime)  # the DAG's baselines timed on another GPU, timed again on this one (issue #16)
      run_for $((secs + 30)) "$S/retime.log" python3 benchmarks/kb_retime.py \
        --campaign "$S/dag/${CAMPAIGN:-kb}" --source "$PWD/.kb" --jobs "${JOBS:-3}" \
        --budget-s "$secs" --out "$S/retime.jsonl" ${ONLY:+--only $ONLY} ${NORMS:+--norms} ;;
    joins)
      run_for "$secs" "$S/joins.log" python3 benchmarks/probe_joins.py --out "$S/joins.md" ;;
    prewarm)
      run_for "$secs" "$S/prewarm.log" python3 benchmarks/probe_compile_prewarm.py \
        ${PROBE:-.kb/level2/34_ConvTranspose3d_LayerNorm_GELU_Scaling.py .kb/level3/45_UNetSoftmax.py .kb/level3/16_DenseNet201.py} \
        --out "$S/prewarm.json" ;;
    streams)
      run_for "$secs" "$S/streams.md" python3 benchmarks/probe_streams.py \
        ${PROBE:-.kb/level2/19_ConvTranspose2d_GELU_GroupNorm.py .kb/level2/34_ConvTranspose3d_LayerNorm_GELU_Scaling.py} ;;
    *) echo "unknown phase: $name (selfcheck, redteam, gputests, audit, triton, inline, batch, verify1, streams, synthkb, dag, retime, joins, prewarm)" ;;
  esac
done
[ -n "${LANE:-}" ] || { tar czf "$OUT/state.tgz" -C "$S" . && ls -la "$OUT"; }
