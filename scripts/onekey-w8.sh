#!/usr/bin/env bash
# Redis memory per holder of one semaphore with 10,000 holders, written as the one-key
# prototype (scripts/onekey-batch-prototype.lua) would write them: one hash, the state
# and slot bitmap in two fields, a record with its deadline under each holder's id.
# Starts a private redis-server on a free port; prints the used_memory delta / 10,000.
# Usage: scripts/onekey-w8.sh    (needs redis-server, redis-cli, python3)
set -euo pipefail
work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" \
    --daemonize yes --pidfile "$work/pid" --logfile "$work/log" >/dev/null
trap 'redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
r="redis-cli -p $port"
for _ in $(seq 1 100); do $r ping >/dev/null 2>&1 && break; sleep 0.1; done
used() { $r info memory | grep '^used_memory:' | tr -d '\r' | cut -d: -f2; }
before=$(used)
python3 - <<'PY' | $r --pipe >/dev/null
import sys, time, uuid
now = int(time.time() * 1000)
def cmd(*a):
    out = b'*%d\r\n' % len(a)
    for x in a:
        x = x if isinstance(x, bytes) else str(x).encode()
        out += b'$%d\r\n%s\r\n' % (len(x), x)
    sys.stdout.buffer.write(out)
cmd('HSET', 'redsem:{w8}', '.', '10000|%d|%d|%d|0|10000' % (now * 1000, now + 10000, now + 11000),
    'b', b'\xff' * 1250)
for i in range(10000):
    cmd('HSET', 'redsem:{w8}', str(uuid.uuid4()),
        '1|%d|%d|%d|%d|12345|worker-host-01|' % (now * 1000 + i, i, now, now + 10000))
PY
after=$(used)
echo "encoding: $($r object encoding 'redsem:{w8}'), fields: $($r hlen 'redsem:{w8}')"
echo "bytes per holder: $(( (after - before) / 10000 ))"
