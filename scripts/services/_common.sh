# shellcheck shell=bash
# What the service scripts share; each sources it from its own folder. Not a service itself:
# .ci/run skips scripts/services/_*.sh.

# The daemons a service script starts must not inherit the caller's descriptors: one started
# under `flock /tmp/ddlbench-cluster.lock` would hold the cluster lock for as long as it runs.
close_inherited_fds() {
  local fd
  for fd in /proc/$$/fd/*; do
    fd=${fd##*/}
    case "$fd" in 0|1|2|255) ;; *) eval "exec $fd>&-" 2>/dev/null || true ;; esac
  done
}

# ensure_commands CMD... -- PKG...: installs the Debian packages when any command is missing.
ensure_commands() {
  local cmds=() missing=0
  while [ $# -gt 0 ] && [ "$1" != -- ]; do cmds+=("$1"); shift; done
  shift
  local cmd
  for cmd in "${cmds[@]}"; do command -v "$cmd" >/dev/null 2>&1 || missing=1; done
  [ "$missing" = 0 ] && return 0
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# A daemon is alive by its pid file, not by name (both SLURM clusters run daemons of the same
# names); one that died unreaped (a zombie) is not alive.
# A pid file's daemon lives: its pid is a live process (not a zombie) of the program the file is
# named after (slurmd-snode0.pid: slurmd). A stale file outlives its daemon, and on a host up for
# days its pid is another process by then (a kernel worker, another user's job): alive by pid
# alone, the daemon would never start again, and a stop would signal a stranger.
pid_alive() {
  [ -f "$1" ] || return 1
  local name line
  name=$(basename "$1" .pid)
  name=${name%%-*}
  line=$(ps -o stat=,comm= -p "$(cat "$1")" 2>/dev/null) || return 1
  case "$line" in Z*) return 1 ;; esac
  [ "$(awk '{print $2}' <<<"$line")" = "$name" ]
}

# munge is shared by both SLURM clusters: its socket is a file, so it works across network
# namespaces.
start_munged() {
  pgrep -x munged >/dev/null && return 0
  [ -f /etc/munge/munge.key ] || mungekey --create
  chown -R munge:munge /etc/munge /var/lib/munge /var/log/munge /run/munge 2>/dev/null || true
  runuser -u munge -- /usr/sbin/munged
}

# The slurm.conf lines both clusters hold alike: authentication, scheduling and how a
# container without cgroups runs jobs.
slurm_conf_common() {
  cat <<'CONF'
SlurmUser=root
SlurmdUser=root
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
CONF
}

# wait_slurmctld TRIES: waits up to TRIES * 0.2 s for slurmctld to answer; 1 when it does not.
wait_slurmctld() {
  local _
  for _ in $(seq 1 "$1"); do
    scontrol ping 2>/dev/null | grep -q UP && return 0
    sleep 0.2
  done
  return 1
}
