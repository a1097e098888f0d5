# shellcheck shell=bash
# What .ci/local_slurm.sh (one node on this machine) and .ci/hosts_slurm.sh (two nodes on the hosts of .ci/hosts.sh)
# share, sourced by both. Not a command of its own.
#
# The sourcing script sets, before calling these functions:
#   prog        its name in messages (local_slurm, hosts_slurm); also names its apt-get log /tmp/<prog>_apt.log
#   dir         the folder everything lives in (slurm.conf, state, pid and log files, env, bin/sacct)
#   port        slurmctld's port; slurmd listens on the one after it
#   lock_file   the lock one start or stop at a time takes
# and defines:
#   client      run a Slurm client (squeue, scancel, sinfo) where it reaches the controller, with its SLURM_CONF
#   running     whether its daemons run and the controller answers
#   daemons_live  whether every daemon it launched still runs
#   why_not     why Slurm cannot start here (one line), or nothing
#   describe    what `status` says after "running: "
#   stop_quietly  stop whatever runs (jobs, daemons), remove <dir>
#   start_hint  (a variable) the command `status` names when nothing runs

EXIT_NOT_RUNNING=3
EXIT_CANNOT_RUN=77

say() { echo "$prog: $*" >&2; }
cannot_run() { echo "$prog: cannot run Slurm here: $*" >&2; exit "$EXIT_CANNOT_RUN"; }

# A pid recorded in <dir>/<file>.pid that still runs program <name> (default: <file>).
live_pid() {
    local file=$dir/$1.pid pid
    [ -r "$file" ] || return 1
    pid=$(cat "$file")
    [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "${2:-$1}" ] && echo "$pid"
}

slurm_installed() { command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null; }

print_env() {
    echo "export SLURM_CONF=$dir/slurm.conf"
    echo "export PATH=\"$dir/bin:\$PATH\""
}

install_packages() {
    slurm_installed && return
    local log=/tmp/${prog}_apt.log
    say "installing slurm-wlm and munge (apt-get)"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            slurm-wlm munge; } >"$log" 2>&1; then
        tail -n 5 "$log" >&2
        cannot_run "apt-get could not install slurm-wlm and munge (log: $log)"
    fi
}

# A node's CPUs as slurmd sees them (a node configured with more than that is drained).
node_topology() {
    slurmd -C 2>/dev/null | head -n 1 | grep -o 'CPUs=.*ThreadsPerCore=[0-9]*' || echo "CPUs=$(nproc)"
}

# MiB of memory for each of <count> nodes: the machine's, less 15 %, split between them.
node_memory_mb() { awk -v n="$1" '/^MemTotal:/ { printf "%d", $2 / 1024 * 0.85 / n }' /proc/meminfo; }

# The slurm.conf settings both Slurms have: ports, munge, no cgroups, cores as the unit, no accounting, quick
# requeue, the controller's files. AuthInfo takes <auth_info> first when given (e.g. a munged socket).
common_config() {
    local auth_info=${1:+$1,}
    cat <<EOF
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$port
SlurmdPort=$((port + 1))
# Each daemon binds to what its hostname resolves to, not to 0.0.0.0.
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
MailProg=/bin/true
AuthType=auth/munge
CredType=cred/munge
# A requeued job may start again cred_expire + 1 s after the requeue (default 120 s), at the main scheduler's
# next pass (every sched_interval, default 60 s): both short here, so a requeued job runs again in ~12 s.
AuthInfo=${auth_info}cred_expire=10
SchedulerParameters=sched_interval=2
# No cgroups: plain process tracking, no task binding.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
# Cores are the unit of allocation: jobs share a node instead of each taking all of it.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=600
StateSaveLocation=$dir/state
SlurmctldPidFile=$dir/slurmctld.daemon.pid
SlurmctldLogFile=$dir/slurmctld.log
EOF
}

# <dir>/bin/sacct and <dir>/env. Without accounting, sacct fails and submitit reads every job as UNKNOWN. submitit
# asks `sacct -o JobID,State,NodeList --parsable2 -j ID ...`: answer that from squeue, which keeps finished jobs
# for MinJobAge seconds.
write_sacct_and_env() {
    mkdir -p "$dir/bin"
    cat >"$dir/bin/sacct" <<'EOF'
#!/bin/sh
# sacct stand-in (.ci/slurm_common.sh): JobID|State|NodeList of the jobs given with -j, from squeue.
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

# Before a start: when it runs already, say so, print the lines again and exit 0 (start is idempotent); else stop
# what a crashed run left, and exit 77 saying why where Slurm cannot run here.
prepare_start() {
    if running; then
        say "already running ($dir)"
        print_env
        exit 0
    fi
    stop_quietly
    local reason
    reason=$(why_not)
    [ -z "$reason" ] || cannot_run "$reason"
}

# Wait (5 s at most) until the munged of <munge args> (e.g. --socket=...) answers; record its pid file <pid_file>
# as <dir>/munged.pid (ours: stop stops it).
await_munged() {
    local pid_file=$1
    shift
    for _ in $(seq 50); do
        if munge "$@" -n 2>/dev/null | unmunge "$@" >/dev/null 2>&1; then
            cp "$pid_file" "$dir/munged.pid"
            return
        fi
        sleep 0.1
    done
    say "munged does not answer"
    return 1
}

# Wait (30 s at most) until <states command> prints <want>; give up early when a daemon is gone. On failure say
# so with the last log lines, stop what started and exit 1.
await_nodes() {
    local want=$1 states_command=$2 states=""
    for _ in $(seq 300); do
        states=$($states_command)
        [ "$states" = "$want" ] && return 0
        daemons_live || break
        sleep 0.1
    done
    say "the nodes did not become idle (${states:-no answer}); last log lines:"
    tail -n 5 "$dir"/*.log "$dir"/*.out >&2 2>/dev/null || true
    stop_quietly
    exit 1
}

# Cancel every job and wait (10 s at most) until none is left: their processes (slurmstepd and below) would
# outlive slurmd.
cancel_jobs() {
    local jobs
    jobs=$(client squeue --noheader --format=%A 2>/dev/null || true)
    # shellcheck disable=SC2086
    [ -z "$jobs" ] || client scancel --full --quiet $jobs 2>/dev/null || true
    for _ in $(seq 100); do
        [ -z "$(client squeue --noheader --states=RUNNING,COMPLETING,PENDING 2>/dev/null)" ] && break
        sleep 0.1
    done
}

# Send TERM to the recorded pids (each <file> or <file>:<program>, as live_pid takes them), wait (bounded: they take
# 1-2 s), then KILL what is left.
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

status() {
    if running; then
        echo "running: $(describe)"
        return 0
    fi
    local reason
    reason=$(why_not)
    if [ -n "$reason" ]; then
        echo "cannot run Slurm here: $reason"
        return "$EXIT_CANNOT_RUN"
    fi
    echo "not running (start it with $start_hint)"
    return "$EXIT_NOT_RUNNING"
}

# Run "$@" holding <lock_file>: one start or stop at a time.
locked() {
    exec 9>"$lock_file"
    flock -w 120 9 || { say "another start or stop holds $lock_file"; exit 1; }
    "$@"
}
