#!/usr/bin/env bash
# A one-node SLURM cluster on loopback, for testing the slurm profile: munged, slurmctld and
# slurmd as root, all state, sockets, logs and pid files under one folder. CPU jobs only (no GPU
# gres). Debian/Ubuntu: installs slurm-wlm and munge with apt-get when they are missing.
#
#   benchmarks/slurm/cluster.sh start DIR    # writes DIR/slurm.conf, starts the daemons, waits
#                                            # until the node is idle; prints `export SLURM_CONF=..`
#   benchmarks/slurm/cluster.sh stop DIR     # stops exactly the daemons started for DIR
#
# Clients (sbatch, squeue, sinfo and Snakemake's slurm executor) find the cluster through
# SLURM_CONF=DIR/slurm.conf. Inside a job, the plugin's jobstep starts the rule with `srun` and
# drops every SLURM_* variable but the job's identity (SLURM_CONF too), so srun reads the default
# /etc/slurm/slurm.conf: start links it to DIR/slurm.conf (refusing to replace a file that is not
# such a link) and stop removes the link.
# Env: SLURM_PARTITION (default: assay), SLURMCTLD_PORT (6817), SLURMD_PORT (6818).
set -euo pipefail

cmd=${1:?usage: cluster.sh start|stop DIR}
dir=${2:?usage: cluster.sh start|stop DIR}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
partition=${SLURM_PARTITION:-assay}

stop() {
  # Only the daemons this script started for $dir, by the pids they wrote.
  local name pid
  for name in slurmd slurmctld munged; do
    [[ -f $dir/$name.pid ]] || continue
    pid=$(cat "$dir/$name.pid")
    if [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid" 2>/dev/null || true
      for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
      kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$dir/$name.pid"
  done
  if [[ -L /etc/slurm/slurm.conf && $(readlink /etc/slurm/slurm.conf) == "$dir/slurm.conf" ]]; then
    rm -f /etc/slurm/slurm.conf
  fi
}

install() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v sbatch >/dev/null && return 0
  [[ $(id -u) == 0 ]] || { echo "cluster.sh: needs root to install slurm-wlm and munge" >&2; exit 1; }
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null 2>&1 || {
    apt-get update -q >/dev/null
    apt-get install -y -q --no-install-recommends slurm-wlm munge >/dev/null
  }
}

start() {
  [[ $(id -u) == 0 ]] || { echo "cluster.sh: run as root (slurmd starts jobs as their user)" >&2; exit 1; }
  install
  stop  # a leftover cluster of the same folder
  mkdir -p "$dir/state" "$dir/spool" "$dir/munge"
  chmod 700 "$dir/munge"
  [[ -f $dir/munge/munge.key ]] || {
    dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$dir/munge/munge.key"
  }
  munged --force --socket="$dir/munge/munge.sock" --key-file="$dir/munge/munge.key" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munge/seed"

  local cpus mem
  cpus=$(nproc)
  # At least 64 GiB announced (config_overrides: slurmd believes the config), so the profile's
  # --mem requests fit on a small test machine; memory is bookkeeping only here (CR_Core).
  mem=$(awk '/MemTotal/ {m = int($2 / 1024 * 0.8); print (m > 65536 ? m : 65536)}' /proc/meminfo)
  cat >"$dir/slurm.conf" <<EOF
# One node on loopback for Assay's SLURM test (benchmarks/slurm/cluster.sh).
ClusterName=assay-test
SlurmctldHost=localhost
SlurmctldPort=${SLURMCTLD_PORT:-6817}
SlurmdPort=${SLURMD_PORT:-6818}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/munge.sock
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
# No cgroups in a container: plain process tracking, no task binding, no accounting. Memory is
# not a consumable (CR_Core): --mem is checked against RealMemory but jobs are packed by CPU only.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
# Finished jobs stay visible to squeue and scontrol for an hour (Snakemake polls with squeue when
# sacct has no database; the run script lists every job of the run at its end).
MinJobAge=3600
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=$partition Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
  export SLURM_CONF=$dir/slurm.conf
  if [[ -e /etc/slurm/slurm.conf && ! -L /etc/slurm/slurm.conf ]]; then
    echo "cluster.sh: /etc/slurm/slurm.conf exists (a real cluster?); not replacing it" >&2
    stop
    exit 1
  fi
  mkdir -p /etc/slurm
  ln -sfn "$SLURM_CONF" /etc/slurm/slurm.conf
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF" -N localhost

  local state=""
  for _ in $(seq 120); do
    state=$(sinfo -h -n localhost -o %T 2>/dev/null || true)
    [[ $state == idle ]] && break
    sleep 0.5
  done
  if [[ $state != idle ]]; then
    echo "cluster.sh: node not idle after 60 s (state: '${state:-no answer}')" >&2
    tail -20 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 || true
    stop
    exit 1
  fi
  echo "export SLURM_CONF=$SLURM_CONF"
}

case $cmd in
  start) start ;;
  stop) stop ;;
  *) echo "usage: cluster.sh start|stop DIR" >&2; exit 2 ;;
esac
