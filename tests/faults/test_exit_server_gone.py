"""A client that exits without closing its connection forgets its consumer row at exit (test_exit.py); with
the server gone by then, the exit does not wait for it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from kombu_akadze.store import NewMessage, Store, migrate

from .pgserver import PgServer

CLIENT = Path(__file__).parents[1] / "integration" / "exiting_client.py"
SCHEMA = "akadze_exit"


def test_a_client_exits_within_seconds_when_the_server_is_gone(pg_server: PgServer) -> None:
    url = pg_server.url()
    migrate.apply(url, SCHEMA)
    store = Store(url, schema=SCHEMA, role="test")
    try:
        store.message_insert(NewMessage(queue="exiting", body=b'"x"', content_type="application/json"))
    finally:
        store.close()
    with subprocess.Popen(
        [sys.executable, str(CLIENT), url, SCHEMA, "wait"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as client:
        try:
            assert client.stdout is not None
            assert client.stdin is not None
            assert client.stdout.readline().strip() == "ready"
            pg_server.stop()
            started = time.monotonic()
            client.stdin.write("\n")
            client.stdin.flush()
            client.wait(timeout=60)
            took = time.monotonic() - started
        finally:
            if client.poll() is None:
                client.kill()
    assert client.returncode == 0
    assert took < 5.0, f"the exit took {took:.1f} s with the server gone"
