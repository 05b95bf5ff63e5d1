"""A client that consumes one message and exits without closing its connection, as `celery inspect`, `celery
call` or a script that waited for a result does; run by test_exit.py.

argv: URL SCHEMA MODE, MODE one of ack (settle it), hold (leave it unsettled), fork (settle it, then a
forked child exits first; the parent prints the consumers the child left alive), wait (settle it, print
"ready", exit at the next line on stdin: the caller breaks the server meanwhile)."""

from __future__ import annotations

import os
import sys

import kombu
from kombu.simple import SimpleQueue

import kombu_akadze  # noqa: F401  registers akadze+
from kombu_akadze.store import Store

url, schema, mode = sys.argv[1:]
conn = kombu.Connection(
    f"akadze+{url}", transport_options={"schema": schema, "heartbeat_interval": 30, "heartbeat_ttl": 60}
)
message = SimpleQueue(conn, "exiting").get(timeout=30)
if mode != "hold":
    message.ack()
    conn.transport.flush_outcomes()
if mode == "fork":
    child = os.fork()
    if child == 0:
        sys.exit(0)  # runs the exit hooks the child inherited
    os.waitpid(child, 0)
    store = Store(url, schema=schema, role="test")
    print(store.queue_stats(ttl=60).consumers_alive, flush=True)
    store.close()
if mode == "wait":
    print("ready", flush=True)
    sys.stdin.readline()
print(conn.transport.consumer_id, flush=True)
