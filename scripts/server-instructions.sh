#!/usr/bin/env bash
# Counts the redis-server instructions one acquire or release script call costs, with
# valgrind's callgrind (instructions, not seconds: the same figure on a busy or an idle
# machine). Starts a private redis-server under callgrind on a free port, runs N
# acquire+release pairs of this checkout's scripts (src/scripts), and prints
#   instructions per script call = (total - total of an empty run) / (2 N).
#
# Usage: scripts/server-instructions.sh [N=1000]   (needs valgrind, redis-server, redis-cli)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-1000}
S=src/scripts
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# run PAIRS: prints the total instructions of a server that ran PAIRS pairs
run() {
    local pairs=$1 port pid
    port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$work/out.$pairs" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        >"$work/vg.$pairs.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 200); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    local r="redis-cli -p $port" keys='redsem:{ins}:h redsem:{ins}:i redsem:{ins}:s redsem:{ins}:q'
    local acq rel
    acq=$($r script load "$(cat $S/common.lua $S/ops.lua $S/acquire.lua)")
    rel=$($r script load "$(cat $S/common.lua $S/ops.lua $S/release.lua)")
    # a long-lived holder keeps the keys, as in a semaphore in use
    $r evalsha "$acq" 4 $keys keeper 1 5 100000 1000 '1|h|' t 1 '' >/dev/null
    for j in $(seq 1 "$pairs"); do
        echo "EVALSHA $acq 4 $keys id$j 1 5 10000 1000 1|h| t 1 x"
        echo "EVALSHA $rel 4 $keys id$j"
    done | $r >/dev/null
    $r shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" || true
    grep -h '^summary:' "$work/out.$pairs" | awk '{print $2}'
}

base=$(run 0)
total=$(run "$N")
echo "redis-server instructions per script call (acquire and release alternating, $N pairs):"
echo "  $(( (total - base) / (2 * N) ))"
