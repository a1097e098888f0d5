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
# files, the env file, and bin/sacct, a stand-in for accounting (written by .ci/slurm_common.sh, which holds what
# this script shares with .ci/hosts_slurm.sh: the common slurm.conf settings, stopping by pid...). The daemons run
# as root and listen on 127.0.0.1 only, on LOCAL_SLURM_PORT and the port after it (default 6817, 6818). munged
# keeps its Debian defaults (/run/munge, /etc/munge/munge.key); one already running is used and left running.
set -euo pipefail

dir=${LOCAL_SLURM_DIR:-/tmp/local_slurm}
port=${LOCAL_SLURM_PORT:-6817}
prog=local_slurm
lock_file=/tmp/local_slurm.lock
start_hint=".ci/local_slurm.sh start"
partition=local
# shellcheck source=.ci/slurm_common.sh
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/slurm_common.sh"

client() { SLURM_CONF=$dir/slurm.conf "$@"; }

node_state() { client sinfo --noheader --nodes=localhost --format=%T 2>/dev/null || true; }

daemons_live() { live_pid slurmctld >/dev/null && live_pid slurmd >/dev/null; }

running() { daemons_live && [ -n "$(node_state)" ]; }

describe() { echo "SLURM_CONF=$dir/slurm.conf, node localhost $(node_state), partition $partition"; }

port_taken() { ss -Hltn "sport = :$1" 2>/dev/null | grep -q .; }

# Why Slurm cannot start here (one line), or nothing. Cheap: no package manager, no daemon is touched.
why_not() {
    if [ "$(uname -s)" != Linux ]; then
        echo "Slurm needs Linux, this is $(uname -s)"
    elif ! slurm_installed; then
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

write_config() {
    mkdir -p "$dir/state" "$dir/spool"
    {
        echo "# Written by .ci/local_slurm.sh: a one-node Slurm for tests."
        echo "ClusterName=local"
        echo "SlurmctldHost=localhost"
        common_config
        cat <<EOF
SlurmdSpoolDir=$dir/spool
SlurmdPidFile=$dir/slurmd.daemon.pid
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 $(node_topology) RealMemory=$(node_memory_mb 1) State=UNKNOWN
PartitionName=$partition Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
    } >"$dir/slurm.conf"
    write_sacct_and_env
}

# munged keeps its Debian defaults; one that answers already is used and left running.
start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
        return
    fi
    install -d -o munge -g munge -m 0755 /run/munge
    if [ ! -s /etc/munge/munge.key ]; then
        runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key
    fi
    runuser -u munge -- munged 9>&-  # not holding our lock
    await_munged /run/munge/munged.pid
}

# Start a daemon in a session of its own, detached from the caller's terminal and pipes; record its pid.
launch() {
    local name=$1
    shift
    SLURM_CONF=$dir/slurm.conf setsid "$@" </dev/null >>"$dir/$name.out" 2>&1 9>&- &
    echo $! >"$dir/$name.pid"
}

start() {
    prepare_start
    install_packages
    local t0=${EPOCHREALTIME/[.,]/}
    write_config
    start_munge
    launch slurmctld slurmctld -D -i
    launch slurmd slurmd -D -N localhost
    await_nodes idle node_state
    say "running in $dir: node localhost idle, partition $partition" \
        "(up in $(((${EPOCHREALTIME/[.,]/} - t0) / 1000)) ms)"
    print_env
}

stop_quietly() {
    [ -d "$dir" ] || return 0
    if live_pid slurmctld >/dev/null && [ -n "$(node_state)" ]; then
        cancel_jobs
    fi
    end_pids slurmd slurmctld munged
    rm -rf "$dir"
}

case "${1:-}" in
    start) locked start ;;
    stop) locked stop_quietly ;;
    status) status ;;
    *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
