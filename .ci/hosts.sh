#!/usr/bin/env bash
# Several hosts on one machine: network namespaces joined by a bridge, each with its own address.
#
#   .ci/hosts.sh up [SET]      create hosts a, b, c of set SET (default 0); prints them as shell variables
#   .ci/hosts.sh down [SET]    remove every namespace and link of set SET (also what a crashed run left)
#   .ci/hosts.sh status [SET]  exit 0 when set SET is up
#
# Set SET is the namespaces rlsvcSET-a, rlsvcSET-b, rlsvcSET-c (the hosts, each with eth0 at 10.77.SET.1, .2 and .3
# on a /24, and its own loopback) and rlsvcSET-hub (the bridge joining them). Nothing is added to the machine's own
# namespace: every link is created inside the namespaces, and removing the namespaces removes the links. Traffic
# between the hosts never leaves the machine. Run a command on a host with `ip netns exec rlsvc0-b COMMAND`.
# Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); exits 77, saying why, where namespaces cannot be made.
set -euo pipefail

action=${1:-}
set_id=${2:-0}
case "$set_id" in ''|*[!0-9]*) echo "hosts.sh: SET must be a number from 0 to 254, got '$set_id'" >&2; exit 2;; esac
[ "$set_id" -le 254 ] || { echo "hosts.sh: SET must be a number from 0 to 254, got '$set_id'" >&2; exit 2; }
prefix="rlsvc${set_id}"
hosts=(a b c)
subnet="10.77.${set_id}"

down() {
    for name in "${hosts[@]}" hub; do
        if ip netns list | grep -qw "^${prefix}-${name}"; then
            # a process still inside keeps the namespace alive after its name is removed: end them first
            for pid in $(ip netns pids "${prefix}-${name}" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
            ip netns delete "${prefix}-${name}"
        fi
    done
}

up() {
    if [ "$(id -u)" -ne 0 ]; then
        echo "hosts.sh: network namespaces need root (running as uid $(id -u))" >&2
        exit 77
    fi
    down
    trap 'down' ERR
    ip netns add "${prefix}-hub" 2>/dev/null || { echo "hosts.sh: 'ip netns add' failed: no network namespaces here" >&2; exit 77; }
    ip -n "${prefix}-hub" link add br0 type bridge
    ip -n "${prefix}-hub" link set dev br0 up
    local i=1
    for name in "${hosts[@]}"; do
        local ns="${prefix}-${name}"
        ip netns add "$ns"
        ip link add eth0 netns "$ns" type veth peer name "to-${name}" netns "${prefix}-hub"
        ip -n "${prefix}-hub" link set dev "to-${name}" master br0 up
        ip -n "$ns" addr add "${subnet}.${i}/24" dev eth0
        ip -n "$ns" link set dev lo up
        ip -n "$ns" link set dev eth0 up
        echo "RLSVC_HOST_${name^^}=${subnet}.${i}"
        echo "RLSVC_NETNS_${name^^}=${ns}"
        i=$((i + 1))
    done
    trap - ERR
}

case "$action" in
    up) up ;;
    down) down ;;
    status) ip netns list | grep -qw "^${prefix}-a" ;;
    *) echo "usage: $0 up|down|status [SET]" >&2; exit 2 ;;
esac
