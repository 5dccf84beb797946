#!/usr/bin/env bash
# A multi-node SLURM cluster on this one host, for the slurm provider's multi-node tests.
#
#   slurm-cluster.sh [start]   K nodes (SLURM_CLUSTER_NODES, default 2) on links of
#                              SLURM_CLUSTER_RATE (tc bit units, default 200mbit)
#   slurm-cluster.sh stop      remove it: daemons, namespaces, links, state
#
# Node i (snode0, snode1, ...) is a network namespace `ddlbench-slurm-i` with one veth,
# named eth0 inside every namespace (so gloo binds the same name on every node), into the
# bridge `ddlbslurm0`. Both ends of every veth are shaped with `tc tbf`, like the netns
# provider's links. The bridge holds 10.215.0.1 on the host side: slurmctld listens there,
# and srun's I/O reaches a submit host there; node i is 10.215.0.(i+2). Every node runs its
# own slurmd in its namespace, with its own hostname (a UTS namespace).
#
# It runs beside scripts/services/slurm.sh's single-node cluster: its own config
# (SLURM_CONF=/etc/slurm-multi/slurm.conf), ports, pid files and state; munge is shared
# (its socket is a file, so it works across network namespaces). Idempotent: when the
# cluster answers with its nodes up, it only makes sure they accept jobs.
set -euo pipefail
. "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/_common.sh"
close_inherited_fds

action=${1:-start}
nodes=${SLURM_CLUSTER_NODES:-2}
rate=${SLURM_CLUSTER_RATE:-200mbit}
etc=/etc/slurm-multi
conf=$etc/slurm.conf
run=/run/slurm-multi
spool=/var/spool/slurm-multi
logs=/var/log/slurm-multi
bridge=ddlbslurm0
net=10.215.0
ctld_port=6917
slurmd_port=6918
export SLURM_CONF=$conf

ns_of() { echo "ddlbench-slurm-$1"; }

stop_cluster() {
  local pidfile ns
  for pidfile in "$run"/slurmd-*.pid "$run"/slurmctld.pid; do
    [ -f "$pidfile" ] || continue
    kill "$(cat "$pidfile")" 2>/dev/null || true
  done
  for _ in $(seq 1 50); do
    local alive=0
    for pidfile in "$run"/*.pid; do pid_alive "$pidfile" && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pidfile in "$run"/*.pid; do
    pid_alive "$pidfile" && kill -9 "$(cat "$pidfile")" 2>/dev/null || true
  done
  for ns in $(ip netns list | awk '{print $1}' | grep '^ddlbench-slurm-' || true); do
    # what still runs there (a job's tasks) keeps the namespace alive
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for dev in $(ip -o link show type veth | awk -F': ' '{print $2}' | cut -d@ -f1 | grep '^dslurmh' || true); do
    ip link del "$dev" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  sed -i '/# ddlbench slurm-cluster$/d' /etc/hosts
  rm -rf "$run" "$spool" "$logs" "$etc"
}

if [ "$action" = stop ]; then
  stop_cluster
  echo "slurm-cluster: removed"
  exit 0
fi
if [ "$action" != start ]; then
  echo "usage: $0 [start|stop]" >&2
  exit 2
fi
case "$nodes" in [1-9]) ;; *) echo "SLURM_CLUSTER_NODES: expected 1 to 9 nodes, got $nodes" >&2; exit 2 ;; esac
case "$rate" in [0-9]*bit) ;; *) echo "SLURM_CLUSTER_RATE: expected a rate in tc bit units (200mbit), got $rate" >&2; exit 2 ;; esac

ensure_commands munged slurmctld slurmd sbatch unshare tc -- munge slurmctld slurmd slurm-client iproute2 util-linux

names=()
for i in $(seq 0 $((nodes - 1))); do names+=("snode$i"); done
last=$((nodes - 1))

# A cluster of another size or rate is rebuilt.
want="# ddlbench slurm-cluster: nodes=$nodes rate=$rate"
if [ -f "$conf" ] && ! grep -qxF "$want" "$conf"; then
  stop_cluster
fi

up() {
  scontrol ping 2>/dev/null | grep -q UP || return 1
  local state
  state=$(sinfo -h -N -o %t 2>/dev/null | sort -u | tr '\n' ' ')
  case "$state" in *drain*|*down*|*fail*|*unk*|"") return 1 ;; esac
}

if ! ip link show "$bridge" >/dev/null 2>&1; then
  ip link add "$bridge" type bridge
  ip addr add "$net.1/24" dev "$bridge"
fi
ip link set "$bridge" up
rate_bits=$(awk -v r="$rate" 'BEGIN { r = tolower(r); sub(/bit$/, "", r); u = substr(r, length(r)); m = 1
  if (u ~ /[kmgt]/) { m = (u == "k") ? 1e3 : (u == "m") ? 1e6 : (u == "g") ? 1e9 : 1e12; r = substr(r, 1, length(r) - 1) }
  printf "%d", r * m }')
# The bucket holds one timer tick at the rate and a full GSO packet (infra/netns.py's _shape).
burst=$((rate_bits / 8 / 250 > 65536 ? rate_bits / 8 / 250 : 65536))
for i in $(seq 0 "$last"); do
  ns=$(ns_of "$i")
  host_dev=dslurmh$i
  if ! ip netns list | awk '{print $1}' | grep -qx "$ns"; then
    ip netns add "$ns"
  fi
  if ! ip link show "$host_dev" >/dev/null 2>&1; then
    ip link add "$host_dev" type veth peer name eth0 netns "$ns"
    ip link set "$host_dev" master "$bridge" up
    ip -n "$ns" addr add "$net.$((i + 2))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
  fi
  tc qdisc replace dev "$host_dev" root tbf rate "${rate_bits}bit" burst "$burst" latency 100ms
  tc -n "$ns" qdisc replace dev eth0 root tbf rate "${rate_bits}bit" burst "$burst" latency 100ms
  grep -q "^$net.$((i + 2)) snode$i " /etc/hosts || echo "$net.$((i + 2)) snode$i # ddlbench slurm-cluster" >>/etc/hosts
done

host=$(hostname -s)
mkdir -p "$etc" "$run" "$spool/ctld" "$logs" /run/munge
if [ ! -f "$conf" ]; then
  # Every node reports this host's CPUs and memory (a node configured with more than it has
  # would be drained); the namespaces share them.
  read -r cpus mem < <(slurmd -C | sed -n 's/.*CPUs=\([0-9]*\).*RealMemory=\([0-9]*\).*/\1 \2/p')
  {
    echo "$want"
    cat <<CONF
ClusterName=ddlbench-multi
SlurmctldHost=$host($net.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$spool/ctld
SlurmdSpoolDir=$spool/%n
SlurmctldPidFile=$run/slurmctld.pid
SlurmdPidFile=$run/slurmd-%n.pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd-%n.log
CONF
    slurm_conf_common
    for i in $(seq 0 "$last"); do
      echo "NodeName=snode$i NodeHostname=snode$i NodeAddr=$net.$((i + 2)) CPUs=$cpus RealMemory=$mem State=UNKNOWN"
    done
    echo "PartitionName=multi Nodes=snode[0-$last] Default=YES MaxTime=INFINITE State=UP"
  } >"$conf"
fi

start_munged
pid_alive "$run/slurmctld.pid" || slurmctld -f "$conf"
for i in $(seq 0 "$last"); do
  mkdir -p "$spool/snode$i"
  pid_alive "$run/slurmd-snode$i.pid" ||
    # nsenter, not `ip netns exec`: that mounts a sysfs of the namespace's own, without the
    # cgroup file system slurmd's cgroup plugin reads at start even with proctrack/linuxproc
    nsenter --net="/run/netns/$(ns_of "$i")" unshare --uts sh -c "hostname snode$i && exec slurmd -f $conf"
done

wait_slurmctld 100 || true
for _ in $(seq 1 100); do
  up && break
  state=$(sinfo -h -N -o %t 2>/dev/null || true)
  case "$state" in
    *drain*|*down*|*fail*) scontrol update NodeName="snode[0-$last]" State=RESUME 2>/dev/null || true ;;
  esac
  sleep 0.2
done
sinfo -h -N -o "slurm-cluster: node %N %t, %c cpus" || true
up || { echo "slurm-cluster: the nodes did not come up (logs: $logs)" >&2; exit 1; }
