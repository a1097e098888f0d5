#!/usr/bin/env bash
# A two-node Slurm across the hosts of .ci/hosts.sh: node `a` (slurmctld and a slurmd) on host a, node `b` (a
# slurmd) on host b, each daemon listening on its host's address only.
#
#   .ci/hosts.sh up SET                  the hosts first
#   .ci/hosts_slurm.sh start [SET]       start munged, slurmctld and both slurmd, wait until both nodes are idle,
#                                        print the lines a caller needs:  eval "$(.ci/hosts_slurm.sh start 0)"
#   .ci/hosts_slurm.sh stop [SET]        cancel the jobs, stop the daemons (by their recorded pids), remove <dir>
#   .ci/hosts_slurm.sh status [SET]      say whether it runs
#
# Slurm's clients (sbatch, squeue, and a driver that submits) reach the controller at host a's address, so they run
# on a host: `ip netns exec rlsvcSET-a sbatch --nodelist=b ...`. From the machine's own namespace nothing answers.
#
# Exit status: 0 running (start: it is now), 3 not running (status only), 77 it cannot run on this machine (one line
# says why, on stdout for status and stderr for start: tests skip with it), 1 anything else failed (the hosts of SET
# are not up, a daemon did not start), 2 usage. start and stop are idempotent; start on a crashed run's leftovers
# stops them first.
#
# Everything lives in <dir> (HOSTS_SLURM_DIR, default /tmp/hosts_slurm.SET): slurm.conf, state, each node's spool,
# pid and log files, a munged of its own (key, socket, log: nothing under /etc/munge or /run/munge is used), the
# hosts files of the daemons, the env file and bin/sacct, the same stand-in for accounting as .ci/local_slurm.sh's
# (.ci/slurm_common.sh holds what the two scripts share). At run time it shares nothing with that one-node Slurm:
# other ports (HOSTS_SLURM_PORT and the one after it, default 6917 and 6918, on the hosts' addresses), its own
# SLURM_CONF, its own munged.
#
# Each daemon runs in its host's network namespace (nsenter --net: the machine's /sys stays, with the cgroup
# filesystem slurmd reads) and in a mount namespace of its own, where /etc/hosts maps this machine's hostname to
# the host's address: CommunicationParameters=NoCtldInAddrAny,NoInAddrAny binds each daemon to what the hostname
# resolves to, as on a real node. Jobs are children of their node's slurmd, so they run on that host, with that
# /etc/hosts; they see SLURMD_NODENAME=a or b (the UTS hostname is the machine's on every host).
set -euo pipefail

action=${1:-}
set_id=${2:-0}
bad_set() { echo "hosts_slurm.sh: SET must be a number from 0 to 254, got '$set_id'" >&2; exit 2; }
case "$set_id" in ''|*[!0-9]*) bad_set ;; esac
[ "$set_id" -le 254 ] || bad_set
dir=${HOSTS_SLURM_DIR:-/tmp/hosts_slurm.$set_id}
port=${HOSTS_SLURM_PORT:-6917}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
prog=hosts_slurm
lock_file=/tmp/hosts_slurm.$set_id.lock
start_hint="$here/hosts_slurm.sh start $set_id"
partition=hosts
nodes=(a b)
# shellcheck source=.ci/slurm_common.sh
source "$here/slurm_common.sh"

netns() { echo "rlsvc${set_id}-$1"; }
address() { case "$1" in a) echo "10.77.${set_id}.1" ;; b) echo "10.77.${set_id}.2" ;; esac; }

# A Slurm client on host a (where the controller listens).
client() { SLURM_CONF=$dir/slurm.conf nsenter --net="/run/netns/$(netns a)" "$@"; }

node_states() { client sinfo --noheader --Node --format=%N=%T 2>/dev/null | sort -u | tr '\n' ' ' || true; }

daemons_live() {
    live_pid slurmctld >/dev/null && live_pid slurmd.a slurmd >/dev/null && live_pid slurmd.b slurmd >/dev/null
}

running() { daemons_live && [ -n "$(node_states)" ]; }

describe() { echo "SLURM_CONF=$dir/slurm.conf, nodes $(node_states)partition $partition"; }

# Why Slurm cannot start here (one line), or nothing. Cheap: no package manager, no daemon is touched.
why_not() {
    if [ "$(uname -s)" != Linux ]; then
        echo "Slurm needs Linux, this is $(uname -s)"
    elif [ "$(id -u)" != 0 ]; then
        echo "network namespaces, munged and slurmd need root (this is uid $(id -u))"
    elif ! command -v nsenter >/dev/null || ! command -v unshare >/dev/null; then
        echo "nsenter and unshare (util-linux) are missing"
    elif ! slurm_installed; then
        command -v apt-get >/dev/null ||
            echo "slurm-wlm and munge are not installed, and there is no apt-get to install them"
    fi
}

hosts_up() { [ -e "/run/netns/$(netns a)" ] && [ -e "/run/netns/$(netns b)" ]; }

write_config() {
    local topology mem_mb name names
    # The machine's CPUs on each node, its memory split between the two.
    topology=$(node_topology)
    mem_mb=$(node_memory_mb 2)
    mkdir -p "$dir/state" "$dir/spool/a" "$dir/spool/b"
    names=$(printf '%s\n' "$(hostname)" "$(hostname -s)" | sort -u | tr '\n' ' ')
    for name in "${nodes[@]}"; do
        printf '127.0.0.1 localhost\n%s %s\n' "$(address "$name")" "$names" >"$dir/hosts.$name"
    done
    {
        echo "# Written by .ci/hosts_slurm.sh: a two-node Slurm on the hosts (network namespaces) of set $set_id."
        echo "ClusterName=hosts$set_id"
        echo "# The controller's host is this machine's hostname, which resolves to host a's address for the daemons."
        echo "SlurmctldHost=$(hostname -s)($(address a))"
        common_config "socket=$dir/munge/socket"
        cat <<EOF
SlurmdSpoolDir=$dir/spool/%n
SlurmdPidFile=$dir/slurmd.%n.daemon.pid
SlurmdLogFile=$dir/slurmd.%n.log
NodeName=a NodeAddr=$(address a) $topology RealMemory=$mem_mb State=UNKNOWN
NodeName=b NodeAddr=$(address b) $topology RealMemory=$mem_mb State=UNKNOWN
PartitionName=$partition Nodes=a,b Default=YES MaxTime=INFINITE State=UP
EOF
    } >"$dir/slurm.conf"
    write_sacct_and_env
}

# A munged of our own: its key and socket in <dir>/munge (munged runs as the munge user and checks that the
# directories on the way are not writable by others).
start_munge() {
    local m=$dir/munge
    chmod 0755 "$dir"
    install -d -o munge -g munge -m 0755 "$m"
    runuser -u munge -- mungekey --create --keyfile="$m/munge.key"
    runuser -u munge -- munged --socket="$m/socket" --key-file="$m/munge.key" --pid-file="$m/munged.pid" \
        --log-file="$m/munged.log" --seed-file="$m/munged.seed" 9>&- ||
        { say "munged did not start: $(tail -n 1 "$m/munged.log")"; return 1; }
    await_munged "$m/munged.pid" --socket="$m/socket"
}

# Start a daemon on host <node>, in a session of its own, detached from the caller's terminal and pipes; record
# its pid as <dir>/<file>.pid (nsenter, unshare, sh and setsid each exec the next: the pid is the daemon's).
launch() {
    local node=$1 file=$2
    shift 2
    SLURM_CONF=$dir/slurm.conf nsenter --net="/run/netns/$(netns "$node")" unshare --mount --propagation private \
        sh -c 'mount --bind "$0" /etc/hosts && exec setsid "$@"' "$dir/hosts.$node" "$@" \
        </dev/null >>"$dir/$file.out" 2>&1 9>&- &
    echo $! >"$dir/$file.pid"
}

start() {
    prepare_start
    hosts_up || { say "the hosts of set $set_id are not up: run .ci/hosts.sh up $set_id first"; exit 1; }
    install_packages
    local t0=${EPOCHREALTIME/[.,]/}
    write_config
    start_munge
    launch a slurmctld slurmctld -D -i
    launch a slurmd.a slurmd -D -N a
    launch b slurmd.b slurmd -D -N b
    await_nodes "a=idle b=idle " node_states
    say "running in $dir: nodes a ($(address a)) and b ($(address b)) idle, partition $partition" \
        "(up in $(((${EPOCHREALTIME/[.,]/} - t0) / 1000)) ms); run clients on a host: ip netns exec $(netns a) ..."
    print_env
}

descendants() {
    local child
    for child in $(ps -o pid= --ppid "$1"); do
        echo "$child"
        descendants "$child"
    done
}

stop_quietly() {
    [ -d "$dir" ] || return 0
    if hosts_up && live_pid slurmctld >/dev/null && [ -n "$(node_states)" ]; then
        cancel_jobs
    fi
    end_pids slurmd.b:slurmd slurmd.a:slurmd slurmctld munged
    # A job whose slurmd was gone (stop after a crash): only our Slurm runs slurmstepd on these hosts; it goes
    # with every process below it.
    if hosts_up; then
        local pid
        for pid in $(ip netns pids "$(netns a)") $(ip netns pids "$(netns b)"); do
            if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ]; then
                # shellcheck disable=SC2086
                kill -KILL "$pid" $(descendants "$pid") 2>/dev/null || true
            fi
        done
    fi
    rm -rf "$dir"
}

case "$action" in
    start) reason=$(why_not); [ -z "$reason" ] || cannot_run "$reason"; locked start ;;
    stop) locked stop_quietly ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status [SET]" >&2; exit 2 ;;
esac
