#!/usr/bin/env bash
# A single-node SLURM cluster for the slurm provider's tests: munge + slurmctld
# + slurmd on this host, one partition. Idempotent: when the daemons already
# answer, it only makes sure the node accepts jobs (about a second).
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_common.sh"
close_inherited_fds

ensure_commands munged slurmctld slurmd sbatch -- munge slurmctld slurmd slurm-client

host=$(hostname -s)
# slurmctld, srun and torchrun's rendezvous all reach this node by its name
getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >>/etc/hosts
conf=/etc/slurm/slurm.conf
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
if [ ! -f "$conf" ] || ! grep -q "^# ddlbench single-node" "$conf"; then
  # slurmd -C reports this host's real CPUs and memory; a node configured with
  # more than it has would be drained.
  node_line=$(slurmd -C | grep '^NodeName=')
  {
    cat <<CONF
# ddlbench single-node cluster (scripts/services/slurm.sh)
ClusterName=ddlbench
SlurmctldHost=$host
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
CONF
    slurm_conf_common
    echo "$node_line State=UNKNOWN"
    echo "PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP"
  } >"$conf"
fi

start_munged
# By pid file, not by name: scripts/services/slurm-cluster.sh runs daemons of the same names.
pid_alive /run/slurmctld.pid || slurmctld
pid_alive /run/slurmd.pid || slurmd

wait_slurmctld 50 || true
state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null || true)
case "$state" in
  *drain*|*down*|*fail*) scontrol update NodeName="$host" State=RESUME || true ;;
esac
for _ in $(seq 1 50); do
  state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null || true)
  case "$state" in idle*|mix*|alloc*) break ;; esac
  sleep 0.2
done
sinfo -h -N -o "slurm: node %N %t, %c cpus" || true
scontrol ping 2>/dev/null | grep -q UP || { echo "slurm.sh: slurmctld does not answer (logs: /var/log/slurm)" >&2; exit 1; }
case "$state" in
  idle*|mix*|alloc*) ;;
  *) echo "slurm.sh: node $host is '${state:-unknown}', not accepting jobs (logs: /var/log/slurm)" >&2; exit 1 ;;
esac
