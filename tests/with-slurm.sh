#!/usr/bin/env bash
# Run a command with a throwaway one-machine SLURM cluster, for the SLURM tests (tests/cluster/test_slurm.py):
#   bash tests/with-slurm.sh .venv/bin/python -m pytest -m cluster
# Installs Debian's slurm-wlm and munge when their daemons are missing, then starts munged, slurmctld and slurmd
# in a temporary folder (their own config, key, socket, state, spool and logs; free local ports), with this
# machine as the one node of partition `gtep` and 2 GPUs declared as generic resources (gres) that no device
# backs: jobs ask for them the SLURM way (--gpus-per-node, --gres=gpu:N) and the study simulates them
# (compute.simulate_gpus). Exports SLURM_CONF (sbatch, squeue, scontrol find the cluster by it) and
# GTEP_TEST_SLURM=1, runs the command and stops the daemons whatever happens. The daemons run as root (sudo
# when the caller is not), as slurmd must to start jobs.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
        || ! command -v sbatch >/dev/null; then
    echo "with-slurm: installing slurm-wlm and munge from Debian's packages" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq slurm-wlm munge >/dev/null
fi
# Debian's packages start their own daemons from /etc when a service manager runs; this cluster is apart from
# them (its own config, socket and ports), so it neither needs nor touches them.
PATH=$PATH:/usr/sbin

dir=$(mktemp -d /tmp/gtep-slurm.XXXXXX)
chmod 755 "$dir"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
ctld_port=$(free_port)
slurmd_port=$(free_port)
node=$(hostname -s)

cleanup() {
    for daemon in slurmd slurmctld munged; do
        if [ -s "$dir/$daemon.pid" ]; then as_root kill "$(cat "$dir/$daemon.pid")" 2>/dev/null || true; fi
    done
    sleep 1
    for daemon in slurmd slurmctld munged; do
        if [ -s "$dir/$daemon.pid" ]; then as_root kill -9 "$(cat "$dir/$daemon.pid")" 2>/dev/null || true; fi
    done
    as_root rm -rf "$dir"
}
trap cleanup EXIT

# munge: a fresh key, its socket in this folder (slurm.conf's AuthInfo names it). --force: munged as root.
as_root mungekey --create --keyfile="$dir/munge.key" --force >/dev/null 2>&1 \
    || as_root sh -c "dd if=/dev/urandom bs=1 count=1024 of='$dir/munge.key' 2>/dev/null"
as_root chmod 400 "$dir/munge.key"
as_root munged --force --socket="$dir/munge.socket" --key-file="$dir/munge.key" --pid-file="$dir/munged.pid" \
    --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"

mkdir -p "$dir/state" "$dir/spool"
cpus=$(nproc)
cat > "$dir/slurm.conf" <<EOF
ClusterName=gtep-test
SlurmctldHost=$node(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
ReturnToService=2
JobRequeue=1
KillWait=10
InactiveLimit=0
MinJobAge=3600
NodeName=$node NodeAddr=127.0.0.1 CPUs=$cpus Gres=gpu:2 State=UNKNOWN
PartitionName=gtep Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
# Two GPUs whose "device files" are plain files here (SLURM drops a GPU without one): it counts, allocates and
# numbers them (CUDA_VISIBLE_DEVICES), and with task/none constrains nothing.
mkdir -p "$dir/dev" && touch "$dir/dev/nvidia0" "$dir/dev/nvidia1"
echo "NodeName=$node Name=gpu File=$dir/dev/nvidia[0-1] AutoDetect=off" > "$dir/gres.conf"
export SLURM_CONF=$dir/slurm.conf

as_root slurmctld -f "$SLURM_CONF" -i
as_root slurmd -f "$SLURM_CONF" -N "$node"

# Ready when the node takes jobs.
for _ in $(seq 60); do
    state=$(sinfo -h -n "$node" -o %T 2>/dev/null || true)
    if [ "$state" = idle ]; then break; fi
    sleep 1
done
if [ "$(sinfo -h -n "$node" -o %T 2>/dev/null || true)" != idle ]; then
    echo "with-slurm: node $node is '${state:-unknown}', not idle, after 60 s; the logs:" >&2
    tail -n 20 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/munged.log" >&2 || true
    exit 1
fi

export GTEP_TEST_SLURM=1
echo "with-slurm: SLURM on $node (slurmctld 127.0.0.1:$ctld_port, SLURM_CONF=$SLURM_CONF)" >&2
"$@"
