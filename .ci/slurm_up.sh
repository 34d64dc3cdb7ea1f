#!/usr/bin/env bash
# A one-node SLURM cluster on this machine for the `slurm` tests: Debian's slurm-wlm + munge (installed when
# absent, needs root), every file under one temporary directory, daemons run as root without cgroups.
#   eval "$(.ci/slurm_up.sh)"     prints `export SLURM_CONF=... RGB_SLURM_DIR=...` for the shell that runs the tests
#   .ci/slurm_down.sh             stops what this started (reads RGB_SLURM_DIR)
set -euo pipefail

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null || ! command -v sinfo >/dev/null; then
  echo "slurm_up: installing slurm-wlm and munge" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends slurm-wlm munge >&2
fi

dir="${RGB_SLURM_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/rgb-slurm.XXXXXX")}"
mkdir -p "$dir"/{munge,state,spool,log}
chmod 700 "$dir" "$dir/munge"
host="$(hostname -s)"
port="${RGB_SLURM_PORT:-6817}"
mem_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))

# munge: a fresh key and socket of its own (never /etc/munge, never /run).
head -c 1024 /dev/urandom > "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" --seed-file="$dir/munge/munge.seed"

cat > "$dir/slurm.conf" <<CONF
ClusterName=rgbci
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
JobRequeue=1
SlurmdTimeout=60
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
echo "include /dev/null" > "$dir/plugstack.conf"
echo "PlugStackConfig=$dir/plugstack.conf" >> "$dir/slurm.conf"

export SLURM_CONF="$dir/slurm.conf"
slurmctld -i
slurmd -N "$host"

for _ in $(seq 60); do
  state="$(sinfo -h -n "$host" -o '%t' 2>/dev/null || true)"
  [ "$state" = "idle" ] && break
  sleep 1
done
if [ "$state" != "idle" ]; then
  echo "slurm_up: node $host is '${state:-not answering}' after 60s; logs in $dir/log" >&2
  tail -n 20 "$dir"/log/*.log >&2 || true
  RGB_SLURM_DIR="$dir" "$(dirname "$0")/slurm_down.sh" >&2 || true
  exit 1
fi
echo "slurm_up: node $host idle ($(nproc) CPUs), SLURM_CONF=$SLURM_CONF" >&2
echo "export SLURM_CONF='$SLURM_CONF' RGB_SLURM_DIR='$dir'"
