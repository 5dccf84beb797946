#!/usr/bin/env bash
# A single-node SLURM cluster for the slurm provider's tests: munge + slurmctld
# + slurmd on this host, one partition. Idempotent: when the daemons already
# answer, it only makes sure the node accepts jobs (about a second).
set -euo pipefail
# The daemons started here must not inherit the caller's descriptors: one started under
# `flock /tmp/ddlbench-cluster.lock` would hold the cluster lock for as long as it runs.
for fd in /proc/$$/fd/*; do
  fd=${fd##*/}
  case "$fd" in 0|1|2|255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
done

need_pkgs=()
for cmd in munged slurmctld slurmd sbatch; do
  command -v "$cmd" >/dev/null 2>&1 || need_pkgs=(munge slurmctld slurmd slurm-client)
done
if [ ${#need_pkgs[@]} -gt 0 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need_pkgs[@]}" >/dev/null
fi

host=$(hostname -s)
# slurmctld, srun and torchrun's rendezvous all reach this node by its name
getent hosts "$host" >/dev/null || echo "127.0.0.1 $host" >>/etc/hosts
conf=/etc/slurm/slurm.conf
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge
if [ ! -f "$conf" ] || ! grep -q "^# ddlbench single-node" "$conf"; then
  # slurmd -C reports this host's real CPUs and memory; a node configured with
  # more than it has would be drained.
  node_line=$(slurmd -C | grep '^NodeName=')
  cat >"$conf" <<CONF
# ddlbench single-node cluster (scripts/services/slurm.sh)
ClusterName=ddlbench
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
AuthType=auth/munge
# No cgroups in a container: track processes by parent pid, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=600
KillWait=5
$node_line State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
fi

if ! pgrep -x munged >/dev/null; then
  [ -f /etc/munge/munge.key ] || mungekey --create
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
  runuser -u munge -- /usr/sbin/munged
fi
# By pid file, not by name: scripts/services/slurm-cluster.sh runs daemons of the same names.
# a daemon that died unreaped (a zombie) is not alive
pid_alive() { [ -f "$1" ] && ps -o stat= -p "$(cat "$1")" 2>/dev/null | grep -qv '^Z'; }
pid_alive /run/slurmctld.pid || slurmctld
pid_alive /run/slurmd.pid || slurmd

for _ in $(seq 1 50); do
  scontrol ping 2>/dev/null | grep -q UP && break
  sleep 0.2
done
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
