#!/usr/bin/env bash
# A real single-node Slurm cluster on this machine, with accounting, to try the sweeps:
#
#   bash scripts/slurm_local_cluster.sh          # install if missing, configure, start
#   bash scripts/slurm_local_cluster.sh stop     # stop the daemons this script started
#
# As root (another user puts `sudo` in front). Debian/Ubuntu, no systemd or cgroups needed. Idempotent: daemons already running
# are left alone; it returns once `sinfo` shows the node idle. The node is `localhost` with
# this machine's CPUs and memory in one partition `local`; CI (.ci/run) starts it before
# the tests. Accounting (slurmdbd + MariaDB) is not optional: without it sacct cannot
# report a cancelled job and submitit's result() waits forever.
set -euo pipefail

ETC=/etc/slurm
STATE=/var/lib/zkl-slurm
LOGS=/var/log/zkl-slurm
RUN=/run/zkl-slurm
DB_PASS=zkl-local-only # the database listens on this machine only
PACKAGES=(slurm-wlm slurmctld slurmd slurm-client slurmdbd munge mariadb-server)

pid_file() { # where each daemon writes its pid (munged and mariadbd do not run as root)
  case $1 in
    munged) echo /run/munge/zkl-munged.pid ;;
    mariadbd) echo /run/mysqld/zkl-mariadbd.pid ;;
    *) echo "$RUN/$1.pid" ;;
  esac
}
running() { [[ -f "$(pid_file "$1")" ]] && kill -0 "$(cat "$(pid_file "$1")")" 2>/dev/null; }

stop() { # only the daemons whose pid files this script made
  for name in slurmd slurmctld slurmdbd munged mariadbd; do
    if running "$name"; then
      pid=$(cat "$(pid_file "$name")")
      kill "$pid"
      for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    fi
    rm -f "$(pid_file "$name")"
  done
}

if [[ "${1:-start}" == "stop" ]]; then
  stop
  exit 0
fi
[[ $EUID -eq 0 ]] || { echo "slurm_local_cluster.sh: run as root (it installs and starts daemons)" >&2; exit 1; }

missing=()
for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if ((${#missing[@]})); then
  echo "installing ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$ETC" "$STATE/ctld" "$STATE/d" "$LOGS" "$RUN" /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge
[[ -s /etc/munge/munge.key ]] || { mungekey --create --force; chown munge:munge /etc/munge/munge.key; }

cpus=$(nproc)
mem_mb=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 512))
cat >"$ETC/slurm.conf" <<EOF
# Written by scripts/slurm_local_cluster.sh: one node, this machine.
ClusterName=zkl-local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
MinJobAge=60
SlurmdTimeout=60
NodeName=localhost CPUs=$cpus RealMemory=$mem_mb State=UNKNOWN
PartitionName=local Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=zkl_slurm_acct
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
EOF
chmod 600 "$ETC/slurmdbd.conf"

wait_for() { # wait_for SECONDS WHAT CMD...: poll CMD until it succeeds
  local seconds=$1 what=$2
  shift 2
  for _ in $(seq $((seconds * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  echo "slurm_local_cluster.sh: $what did not come up; see $LOGS" >&2
  return 1
}

if ! running mariadbd; then
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  [[ -d /var/lib/mysql/mysql ]] || mariadb-install-db --user=mysql >/dev/null
  mariadbd --user=mysql --bind-address=127.0.0.1 --pid-file="$(pid_file mariadbd)" \
    >>"$LOGS/mariadb.log" 2>&1 &
  wait_for 60 mariadb mariadb -e "SELECT 1"
fi
mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
  GRANT ALL ON zkl_slurm_acct.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"

if ! running munged; then
  # fails harmlessly when a munged it did not start already serves the socket
  runuser -u munge -- munged --pid-file="$(pid_file munged)" || true
fi
wait_for 20 munge bash -c "munge -n | unmunge"

if ! running slurmdbd; then
  slurmdbd
  wait_for 60 slurmdbd sacctmgr -n show cluster
fi
sacctmgr -n show cluster format=cluster | grep -q zkl-local ||
  sacctmgr -i add cluster zkl-local >/dev/null
if ! running slurmctld; then
  slurmctld -c # a fresh controller forgets the jobs of earlier sessions (-c: clear state)
  wait_for 60 slurmctld scontrol ping
fi
if ! running slurmd; then
  slurmd -N localhost
fi
node_idle() { [[ "$(sinfo -h -n localhost -o %T)" =~ ^(idle|mixed|allocated) ]]; }
if ! wait_for 30 "the node" node_idle; then
  scontrol update NodeName=localhost State=RESUME || true
  wait_for 30 "the node" node_idle
fi
sinfo
