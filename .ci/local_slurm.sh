#!/usr/bin/env bash
# A one-node Slurm on this machine (for the tests, and to try `hydra/launcher=slurm` without a cluster).
#
#   .ci/local_slurm.sh start    install if missing (apt-get), start munged, slurmctld and slurmd, wait until the
#                               node is idle, print the lines a caller needs:
#                                   eval "$(.ci/local_slurm.sh start)"      (or: source <dir>/env)
#   .ci/local_slurm.sh stop     cancel the jobs, stop the daemons it started (by their recorded pids), remove <dir>
#   .ci/local_slurm.sh status   say whether it runs here
#
# Exit status: 0 running (start: it is now), 3 not running (status only), 77 Slurm cannot run on this machine
# (one line says why, on stdout for status and stderr for start: tests skip with it), 1 anything else failed,
# 2 usage.
# start and stop are idempotent: start on a running Slurm only prints the lines again, stop on none does nothing.
#
# Everything lives in <dir> (LOCAL_SLURM_DIR, default /tmp/local_slurm): slurm.conf, state, spool, pid and log
# files, the env file, and bin/sacct, a stand-in for accounting (see below). The daemons run as root and listen
# on 127.0.0.1 only, on LOCAL_SLURM_PORT and the port after it (default 6817, 6818). munged keeps its Debian
# defaults (/run/munge, /etc/munge/munge.key); one already running is used and left running.
set -euo pipefail

dir=${LOCAL_SLURM_DIR:-/tmp/local_slurm}
port=${LOCAL_SLURM_PORT:-6817}
partition=local
EXIT_NOT_RUNNING=3
EXIT_CANNOT_RUN=77

say() { echo "local_slurm: $*" >&2; }
cannot_run() { echo "local_slurm: cannot run Slurm here: $*" >&2; exit "$EXIT_CANNOT_RUN"; }

# A pid recorded in <dir>/<name>.pid that still runs the program it was recorded for.
live_pid() {
    local file=$dir/$1.pid pid
    [ -r "$file" ] || return 1
    pid=$(cat "$file")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] && echo "$pid"
}

node_state() { SLURM_CONF=$dir/slurm.conf sinfo --noheader --nodes=localhost --format=%T 2>/dev/null || true; }

running() { live_pid slurmctld >/dev/null && live_pid slurmd >/dev/null && [ -n "$(node_state)" ]; }

port_taken() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# Why Slurm cannot start here (one line), or nothing. Cheap: no package manager, no daemon is touched.
why_not() {
    if [ "$(uname -s)" != Linux ]; then
        echo "Slurm needs Linux, this is $(uname -s)"
    elif ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
        if [ "$(id -u)" != 0 ]; then
            echo "slurm-wlm and munge are not installed, and installing them needs root"
        elif ! command -v apt-get >/dev/null; then
            echo "slurm-wlm and munge are not installed, and there is no apt-get to install them"
        fi
    elif [ "$(id -u)" != 0 ]; then
        echo "starting munged and slurmd needs root (this is uid $(id -u))"
    fi
    if [ "$(id -u)" = 0 ] && command -v ss >/dev/null && ! live_pid slurmctld >/dev/null; then
        for p in "$port" "$((port + 1))"; do
            if port_taken "$p"; then
                echo "port $p is taken by another program (another Slurm?): set LOCAL_SLURM_PORT to a free one"
                break
            fi
        done
    fi
}

print_env() {
    echo "export SLURM_CONF=$dir/slurm.conf"
    echo "export PATH=\"$dir/bin:\$PATH\""
}

install_packages() {
    command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null && return
    say "installing slurm-wlm and munge (apt-get)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            slurm-wlm munge; } >"/tmp/local_slurm_apt.log" 2>&1; then
        tail -n 5 /tmp/local_slurm_apt.log >&2
        cannot_run "apt-get could not install slurm-wlm and munge (log: /tmp/local_slurm_apt.log)"
    fi
}

write_config() {
    local topology mem_mb
    # The node as slurmd sees it (a node configured with more than that is drained), memory below the machine's.
    topology=$(slurmd -C 2>/dev/null | head -n 1 | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*' || echo "CPUs=$(nproc)")
    mem_mb=$(awk '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.85 }' /proc/meminfo)
    mkdir -p "$dir/state" "$dir/spool" "$dir/bin"
    cat >"$dir/slurm.conf" <<EOF
# Written by .ci/local_slurm.sh: a one-node Slurm for tests.
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
MailProg=/bin/true
AuthType=auth/munge
# No cgroups: plain process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Cores are the unit of allocation: jobs share the node instead of each taking all of it.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
# A requeued job may start again cred_expire + 1 s after the requeue (default 120 s), at the main scheduler's
# next pass (every sched_interval, default 60 s): both short here, so a requeued job runs again in ~12 s.
AuthInfo=cred_expire=10
SchedulerParameters=sched_interval=2
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmdPidFile=$dir/slurmd.daemon.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 $topology RealMemory=$mem_mb State=UNKNOWN
PartitionName=$partition Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    # Without accounting, sacct fails and submitit reads every job as UNKNOWN. submitit asks
    # `sacct -o JobID,State,NodeList --parsable2 -j ID ...`: answer that from squeue, which keeps finished jobs
    # for MinJobAge seconds.
    cat >"$dir/bin/sacct" <<'EOF'
#!/bin/sh
# sacct stand-in (.ci/local_slurm.sh): JobID|State|NodeList of the jobs given with -j, from squeue.
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

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return  # a munged already answers: use it, leave it running
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
    runuser -u munge -- munged 9>&-  # not holding our lock
    for _ in $(seq 50); do
        if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
            cp /run/munge/munged.pid "$dir/munged.pid"  # ours: stop stops it
            return
        fi
        sleep 0.1
    done
    say "munged does not answer"
    return 1
}

# Start a daemon in a session of its own, detached from the caller's terminal and pipes; record its pid.
launch() {
    local name=$1
    shift
    SLURM_CONF=$dir/slurm.conf setsid "$@" </dev/null >>"$dir/$name.out" 2>&1 9>&- &
    echo $! >"$dir/$name.pid"
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
    install_packages
    local t0=${EPOCHREALTIME/[.,]/}
    write_config
    start_munge
    launch slurmctld slurmctld -D -i
    launch slurmd slurmd -D -N localhost
    local state=""
    for _ in $(seq 300); do  # 30 s at most
        state=$(node_state)
        [ "$state" = idle ] && break
        if ! live_pid slurmctld >/dev/null || ! live_pid slurmd >/dev/null; then
            break
        fi
        sleep 0.1
    done
    if [ "$state" != idle ]; then
        say "the node did not become idle (state: ${state:-no answer}); last log lines:"
        tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" "$dir/slurmctld.out" "$dir/slurmd.out" >&2 2>/dev/null || true
        stop_quietly
        exit 1
    fi
    say "running in $dir: node localhost idle, partition $partition (up in $(((${EPOCHREALTIME/[.,]/} - t0) / 1000)) ms)"
    print_env
}

# Send TERM to the recorded pids, wait (bounded: they take 1-2 s), then KILL what is left.
end_pids() {
    local pids=() name pid
    for name in "$@"; do
        pid=$(live_pid "$name") && pids+=("$pid")
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

stop_quietly() {
    [ -d "$dir" ] || return 0
    if live_pid slurmctld >/dev/null && [ -n "$(node_state)" ]; then
        # Jobs first: their processes (slurmstepd and below) would outlive slurmd.
        local jobs
        jobs=$(SLURM_CONF=$dir/slurm.conf squeue --noheader --format=%A 2>/dev/null || true)
        # shellcheck disable=SC2086
        [ -z "$jobs" ] || SLURM_CONF=$dir/slurm.conf scancel --full --quiet $jobs 2>/dev/null || true
        for _ in $(seq 100); do
            [ -z "$(SLURM_CONF=$dir/slurm.conf squeue --noheader --states=RUNNING,COMPLETING,PENDING 2>/dev/null)" ] && break
            sleep 0.1
        done
    fi
    end_pids slurmd slurmctld munged
    rm -rf "$dir"
}

status() {
    if running; then
        echo "running: SLURM_CONF=$dir/slurm.conf, node localhost $(node_state), partition $partition"
        return 0
    fi
    local reason
    reason=$(why_not)
    if [ -n "$reason" ]; then
        echo "cannot run Slurm here: $reason"
        return "$EXIT_CANNOT_RUN"
    fi
    echo "not running (start it with .ci/local_slurm.sh start)"
    return "$EXIT_NOT_RUNNING"
}

# One start or stop at a time on this machine.
locked() {
    exec 9>"/tmp/local_slurm.lock"
    flock -w 120 9 || { say "another start or stop holds /tmp/local_slurm.lock"; exit 1; }
    "$@"
}

case "${1:-}" in
    start) locked start ;;
    stop) locked stop_quietly ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
