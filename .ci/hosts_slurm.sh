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
# hosts files of the daemons, the env file and bin/sacct, the same stand-in for accounting as .ci/local_slurm.sh's.
# It shares nothing with that one-node Slurm: other ports (HOSTS_SLURM_PORT and the one after it, default 6917 and
# 6918, on the hosts' addresses), its own SLURM_CONF, its own munged.
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
here=$(cd "$(dirname "$0")" && pwd)
partition=hosts
nodes=(a b)
EXIT_NOT_RUNNING=3
EXIT_CANNOT_RUN=77

netns() { echo "rlsvc${set_id}-$1"; }
address() { case "$1" in a) echo "10.77.${set_id}.1" ;; b) echo "10.77.${set_id}.2" ;; esac; }
say() { echo "hosts_slurm: $*" >&2; }
cannot_run() { echo "hosts_slurm: cannot run Slurm here: $*" >&2; exit "$EXIT_CANNOT_RUN"; }

# A pid recorded in <dir>/<file>.pid that still runs program <name> (default: <file>).
live_pid() {
    local file=$dir/$1.pid pid
    [ -r "$file" ] || return 1
    pid=$(cat "$file")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${2:-$1}" ] && echo "$pid"
}

# A Slurm client on host a (where the controller listens).
client() { SLURM_CONF=$dir/slurm.conf nsenter --net="/run/netns/$(netns a)" "$@"; }

node_states() { client sinfo --noheader --Node --format=%N=%T 2>/dev/null | sort -u | tr '\n' ' ' || true; }

daemons_live() {
    live_pid slurmctld >/dev/null && live_pid slurmd.a slurmd >/dev/null && live_pid slurmd.b slurmd >/dev/null
}

running() { daemons_live && [ -n "$(node_states)" ]; }

# Why Slurm cannot start here (one line), or nothing. Cheap: no package manager, no daemon is touched.
why_not() {
    if [ "$(uname -s)" != Linux ]; then
        echo "Slurm needs Linux, this is $(uname -s)"
    elif [ "$(id -u)" != 0 ]; then
        echo "network namespaces, munged and slurmd need root (this is uid $(id -u))"
    elif ! command -v nsenter >/dev/null || ! command -v unshare >/dev/null; then
        echo "nsenter and unshare (util-linux) are missing"
    elif ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
        command -v apt-get >/dev/null ||
            echo "slurm-wlm and munge are not installed, and there is no apt-get to install them"
    fi
}

hosts_up() { [ -e "/run/netns/$(netns a)" ] && [ -e "/run/netns/$(netns b)" ]; }

print_env() {
    echo "export SLURM_CONF=$dir/slurm.conf"
    echo "export PATH=\"$dir/bin:\$PATH\""
}

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
    say "installing slurm-wlm and munge (apt-get)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            slurm-wlm munge; } >"/tmp/hosts_slurm_apt.log" 2>&1; then
        tail -n 5 /tmp/hosts_slurm_apt.log >&2
        cannot_run "apt-get could not install slurm-wlm and munge (log: /tmp/hosts_slurm_apt.log)"
    fi
}

write_config() {
    local topology mem_mb name names
    # The node as slurmd sees it (a node configured with more than that is drained); the machine's memory is
    # split between the two nodes.
    topology=$(slurmd -C 2>/dev/null | head -n 1 | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*' || echo "CPUs=$(nproc)")
    mem_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.85 / 2 }' /proc/meminfo)
    mkdir -p "$dir/state" "$dir/bin" "$dir/spool/a" "$dir/spool/b"
    names=$(printf '%s\n' "$(hostname)" "$(hostname -s)" | sort -u | tr '\n' ' ')
    for name in "${nodes[@]}"; do
        printf '127.0.0.1 localhost\n%s %s\n' "$(address "$name")" "$names" >"$dir/hosts.$name"
    done
    cat >"$dir/slurm.conf" <<EOF
# Written by .ci/hosts_slurm.sh: a two-node Slurm on the hosts (network namespaces) of set $set_id.
ClusterName=hosts$set_id
# The controller's host is this machine's hostname, which resolves to host a's address for the daemons.
SlurmctldHost=$(hostname -s)($(address a))
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
# Each daemon binds to what its hostname resolves to (its host's address), not to 0.0.0.0.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
MailProg=/bin/true
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$dir/munge/socket,cred_expire=10
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
SchedulerParameters=sched_interval=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool/%n
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmdPidFile=$dir/slurmd.%n.daemon.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.%n.log
NodeName=a NodeAddr=$(address a) $topology RealMemory=$mem_mb State=UNKNOWN
NodeName=b NodeAddr=$(address b) $topology RealMemory=$mem_mb State=UNKNOWN
PartitionName=$partition Nodes=a,b Default=YES MaxTime=INFINITE State=UP
EOF
    # Without accounting, sacct fails and submitit reads every job as UNKNOWN: answer its
    # `sacct -o JobID,State,NodeList --parsable2 -j ID ...` from squeue (finished jobs stay MinJobAge seconds).
    cat >"$dir/bin/sacct" <<'EOF'
#!/bin/sh
# sacct stand-in (.ci/hosts_slurm.sh): JobID|State|NodeList of the jobs given with -j, from squeue.
jobs=""
while [ $# -gt 0 ]; do
    case "$1" in
        -j|--jobs) jobs="$jobs${jobs:+,}$2"; shift 2 ;;
        --jobs=*) jobs="$jobs${jobs:+,}${1#--jobs=}"; shift ;;
        *) shift ;;
    esac
done
echo "JobID|State|NodeList"
squeue --noheader --array --states=all ${jobs:+--jobs="$jobs"} --format='%i|%T|%N' 2>/dev/null
exit 0
EOF
    chmod +x "$dir/bin/sacct"
    print_env >"$dir/env"
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
    for _ in $(seq 50); do
        if munge --socket="$m/socket" -n 2>/dev/null | unmunge --socket="$m/socket" >/dev/null 2>&1; then
            cp "$m/munged.pid" "$dir/munged.pid"
            return
        fi
        sleep 0.1
    done
    say "munged does not answer"
    return 1
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
    if running; then
        say "already running ($dir)"
        print_env
        return
    fi
    stop_quietly
    local reason
    reason=$(why_not)
    [ -z "$reason" ] || cannot_run "$reason"
    hosts_up || { say "the hosts of set $set_id are not up: run .ci/hosts.sh up $set_id first"; exit 1; }
    install_packages
    local t0=${EPOCHREALTIME/[.,]/}
    write_config
    start_munge
    launch a slurmctld slurmctld -D -i
    launch a slurmd.a slurmd -D -N a
    launch b slurmd.b slurmd -D -N b
    local states="" want="a=idle b=idle "
    for _ in $(seq 300); do  # 30 s at most
        states=$(node_states)
        [ "$states" = "$want" ] && break
        daemons_live || break
        sleep 0.1
    done
    if [ "$states" != "$want" ]; then
        say "the nodes did not become idle (${states:-no answer}); last log lines:"
        tail -n 5 "$dir"/*.log "$dir"/*.out >&2 2>/dev/null || true
        stop_quietly
        exit 1
    fi
    say "running in $dir: nodes a ($(address a)) and b ($(address b)) idle, partition $partition" \
        "(up in $(((${EPOCHREALTIME/[.,]/} - t0) / 1000)) ms); run clients on a host: ip netns exec $(netns a) ..."
    print_env
}

# Send TERM to the recorded pids, wait (bounded: they take 1-2 s), then KILL what is left.
end_pids() {
    local pids=() spec pid
    for spec in "$@"; do
        pid=$(live_pid "${spec%%:*}" "${spec#*:}") && pids+=("$pid")
    done
    [ "${#pids[@]}" -gt 0 ] || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    local alive
    for _ in $(seq 100); do
        alive=0
        for pid in "${pids[@]}"; do
            [ -d "/proc/$pid" ] && alive=1
        done
        [ "$alive" = 1 ] || return 0
        sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
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
        # Jobs first: their processes (slurmstepd and below) would outlive slurmd.
        local jobs
        jobs=$(client squeue --noheader --format=%A 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -z "$jobs" ] || client scancel --full --quiet $jobs 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(client squeue --noheader --states=RUNNING,COMPLETING,PENDING 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    end_pids slurmd.b:slurmd slurmd.a:slurmd slurmctld:slurmctld munged:munged
    # A job whose slurmd was gone (stop after a crash): only our Slurm runs slurmstepd on these hosts; it goes
    # with every process below it.
    if hosts_up; then
        local pid
        for pid in $(ip netns pids "$(netns a)") $(ip netns pids "$(netns b)"); do
            if [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = slurmstepd ]; then
                # shellcheck disable=SC2046
                kill -KILL "$pid" $(descendants "$pid") 2>/dev/null || true
            fi
        done
    fi
    rm -rf "$dir"
}

status() {
    if running; then
        echo "running: SLURM_CONF=$dir/slurm.conf, nodes $(node_states)partition $partition"
        return 0
    fi
    local reason
    reason=$(why_not)
    if [ -n "$reason" ]; then
        echo "cannot run Slurm here: $reason"
        return "$EXIT_CANNOT_RUN"
    fi
    echo "not running (start it with $here/hosts_slurm.sh start $set_id)"
    return "$EXIT_NOT_RUNNING"
}

# One start or stop of a set at a time.
locked() {
    exec 9>"/tmp/hosts_slurm.$set_id.lock"
    flock -w 120 9 || { say "another start or stop holds /tmp/hosts_slurm.$set_id.lock"; exit 1; }
    "$@"
}

case "$action" in
    start) reason=$(why_not); [ -z "$reason" ] || cannot_run "$reason"; locked start ;;
    stop) locked stop_quietly ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status [SET]" >&2; exit 2 ;;
esac
