"""What the Python peers share: their output, and the contention run the Rust tests
drive (tests/support/python.rs, `contend_with_peers`). The algorithms stay in each
peer, written from its seed; only this harness around them is common."""

import sys
import threading
import time


def say(*words):
    print(*words, flush=True)


def contend(conn, inside_key, try_once, hold=0.0, backoff=0.0):
    """READY, then after the start line, until a "stop" line: `try_once()` gives a
    release callable for a permit it got, or None. Each permit held increments the
    shared counter `inside_key` while held (for `hold` seconds: holders must overlap),
    so its highest value is the most holders at once; a refused try waits `backoff`.
    Ends with RESULT grants=<n> most=<m>."""
    say("READY")
    sys.stdin.readline()  # the start signal
    stop = threading.Event()

    def watch_stdin():
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    grants = most = 0
    while not stop.is_set():
        release = try_once()
        if release is None:
            time.sleep(backoff)
            continue
        grants += 1
        most = max(most, conn.incr(inside_key))
        time.sleep(hold)  # the work the permit guards
        conn.decr(inside_key)
        release()
    say("RESULT", "grants=%d" % grants, "most=%d" % most)
