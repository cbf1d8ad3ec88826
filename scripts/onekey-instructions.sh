#!/usr/bin/env bash
# Counts the redis-server instructions one call of scripts/onekey-batch-prototype.lua
# costs (a measurement prototype of W2's batch on one hash per semaphore, not used by
# the library), with the same calls as `scripts/server-instructions.sh N batch`.
# Usage: scripts/onekey-instructions.sh [N=1000]
set -euo pipefail
N=${1:-1000}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
id() { printf '00000000-0000-4000-8000-%012d' "$1"; }
run() {
    local calls=$1 port pid
    port=$(free_port)
    valgrind --tool=callgrind --callgrind-out-file="$work/out.$calls" \
        redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no >"$work/vg.$calls.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
    local r="redis-cli -p $port" limit=3
    bat=$($r script load "$(cat "$(dirname "${BASH_SOURCE[0]}")"/onekey-batch-prototype.lua)")
    local now_ms=$(( $(date +%s%3N) ))
    local far=$(( now_ms + 100000000 ))
    $r hset 'redsem:{ins}' . "1|1|$far|$((far+1000))|0|3" b "$(printf '\200')" "$(id 0)" "1|1|0|$now_ms|$far|1|h|" >/dev/null
    $r pexpireat 'redsem:{ins}' $((far+1000)) >/dev/null
    for j in $(seq 1 "$calls"); do
        local b=$((4 * j)) p=$((4 * (j - 1)))
        local rels=""
        [ "$j" -gt 1 ] && rels="r $(id $((p + 1))) r $(id $((p + 2)))"
        echo "EVALSHA $bat 1 redsem:{ins} $rels a $(id $((b + 1))) 1 $limit 10000 1000 1000 1|h| t 1 x 0 A $(id $((b + 2))) 0 A $(id $((b + 3))) 0 A $(id $((b + 4))) 0"
    done | $r > "$work/replies.$calls"
    [ "$calls" -gt 0 ] && { sort "$work/replies.$calls" | uniq -c | sort -rn | head -5 >&2; $r hlen 'redsem:{ins}' >&2; }
    $r shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" || true
    grep -h '^summary:' "$work/out.$calls" | awk '{print $2}'
}
base=$(run 0)
total=$(run "$N")
echo "prototype one-key batch, redis-server instructions per call ($N calls): $(( (total - base) / N ))"
