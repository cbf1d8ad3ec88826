#!/usr/bin/env bash
# Counts the redis-server instructions one script call of the hot path costs, with
# valgrind's callgrind (instructions, not seconds: the same figure on a busy or an idle
# machine). Starts a private redis-server under callgrind on a free port, runs N calls
# of this checkout's scripts (src/scripts, assembled as src/scripts/sources.rs says) on a
# semaphore that a long-lived holder keeps in use, and prints
#   instructions per script call = (total - total of an empty run) / calls.
#
# Workloads:
#   pair  acquire+release pairs on a limit-5 semaphore (fast grant, fast release)
#   idle  the same pairs with no long-lived holder: each acquire creates the keys and
#         each release deletes them (W1's calls)
#   no    tries on a limit-1 semaphore the keeper holds (the fast "no")
#   batch combined calls as W2 makes them, on a limit-3 semaphore the keeper holds one
#         permit of: each call releases the two permits the call before it got, then
#         makes four tries ('a' and three 'A'), two granted and two refused (6
#         operations per call; divide by 6 for a figure per operation)
#
# Usage: scripts/server-instructions.sh [N=1000] [pair|idle|no|batch] [OUT]
#   OUT: keep the callgrind file of the N-call run there (callgrind_annotate OUT).
# Needs valgrind, redis-server, redis-cli, python3.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
N=${1:-1000}
WORKLOAD=${2:-pair}
OUT=${3:-}
S=src/scripts
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# the text of script $1 (ACQUIRE, RELEASE), its parts listed in src/scripts/sources.rs
source_of() {
    local part
    for part in $(sed -n "/const $1: /,/);/p" $S/sources.rs | grep -o '"[a-z_]*\.lua"' | tr -d '"'); do
        cat "$S/$part"
    done
}

# uuid-shaped permit id number $1
id() { printf '00000000-0000-4000-8000-%012d' "$1"; }

# run CALLS: prints the total instructions of a server that ran the workload's CALLS calls
run() {
    local calls=$1 port pid
    port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$work/out.$calls" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        >"$work/vg.$calls.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do
        redis-cli -p "$port" ping >/dev/null 2>&1 && break
        sleep 0.1
    done
    local r="redis-cli -p $port" keys='redsem:{ins}:h redsem:{ins}:i redsem:{ins}:s redsem:{ins}:q'
    local acq rel bat limit=5
    acq=$($r script load "$(source_of ACQUIRE)")
    rel=$($r script load "$(source_of RELEASE)")
    bat=$($r script load "$(source_of BATCH)")
    [ "$WORKLOAD" = no ] && limit=1
    [ "$WORKLOAD" = batch ] && limit=3
    # a long-lived holder keeps the keys, as in a semaphore in use (not for idle)
    [ "$WORKLOAD" = idle ] ||
        $r evalsha "$acq" 4 $keys "$(id 0)" 1 $limit 100000 1000 1000 '1|h|' t 1 '' 0 >/dev/null
    if [ "$WORKLOAD" = no ]; then
        for j in $(seq 1 "$calls"); do
            echo "EVALSHA $acq 4 $keys $(id "$j") 1 $limit 10000 1000 1000 1|h| t 1 x 0"
        done | $r >/dev/null
    elif [ "$WORKLOAD" = batch ]; then
        # call j tries ids 4j+1..4j+4 (the first two granted) and releases 4(j-1)+1, +2
        for j in $(seq 1 "$calls"); do
            local b=$((4 * j)) p=$((4 * (j - 1)))
            local rels=""
            [ "$j" -gt 1 ] && rels="r $(id $((p + 1))) r $(id $((p + 2)))"
            echo "EVALSHA $bat 4 $keys $rels a $(id $((b + 1))) 1 $limit 10000 1000 1000 1|h| t 1 x 0 A $(id $((b + 2))) 0 A $(id $((b + 3))) 0 A $(id $((b + 4))) 0"
        done | $r >/dev/null
    else
        for j in $(seq 1 $((calls / 2))); do
            echo "EVALSHA $acq 4 $keys $(id "$j") 1 $limit 10000 1000 1000 1|h| t 1 x 0"
            echo "EVALSHA $rel 4 $keys $(id "$j")"
        done | $r >/dev/null
    fi
    $r shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" || true
    [ -n "$OUT" ] && [ "$calls" -gt 0 ] && cp "$work/out.$calls" "$OUT"
    grep -h '^summary:' "$work/out.$calls" | awk '{print $2}'
}

base=$(run 0)
total=$(run "$N")
echo "redis-server instructions per script call ($WORKLOAD, $N calls):"
echo "  $(( (total - base) / N ))"
