"""durable_acks on a throwaway PostgreSQL whose commits wait for a synchronous standby that never
connects (synchronous_standby_names = 'standby1'): a commit that waits for the WAL flush waits there
for ever, one committed asynchronously returns at once. That shows, without a crash, which acks and
claims wait: off (the default) they return; on, they wait like every publish."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import NewMessage, Store, migrate

from .conftest import SCHEMA
from .pgserver import PgServer

QUEUE = "durable"


def _require_standby(server: PgServer) -> None:
    server.execute("sync_standby_set")
    server.execute("reload")
    eventually(lambda: server.execute("sync_standby_show") == [("standby1",)], timeout=30, what="the reload")


def _returns(call: Callable[[], Any], within: float = 30.0) -> Any:
    """call()'s result, run on a thread; fails if it has not returned *within* seconds (a commit
    waiting for the standby never would)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(within)
    assert result, f"still waiting after {within:.0f} s: its commit waits for the standby"
    return result[0]


def test_acks_and_claims_skip_the_wal_flush_unless_durable_acks(pg_server: PgServer) -> None:
    url = pg_server.url()
    migrate.apply(url, SCHEMA)
    setup = Store(url, schema=SCHEMA, role="setup")
    relaxed = Store(url, schema=SCHEMA, role="relaxed")
    durable = Store(url, schema=SCHEMA, role="durable", durable_acks=True)
    try:
        setup.message_insert_many([NewMessage(queue=QUEUE, body=b"%d" % i) for i in range(4)])
        setup.consumer_heartbeat(consumer_id="c", hostname="h", pid=1)
        relaxed.connection()
        durable.connection()
        _require_standby(pg_server)

        # Relaxed (the default): claim, then ack + claim, then a plain ack: each returns, no standby.
        (first,), _, _ = _returns(lambda: relaxed.message_ack_claim(acks=[], queues=[QUEUE], limits=[1], owner="c"))
        (second,), acked, _ = _returns(
            lambda: relaxed.message_ack_claim(acks=[first.tag], queues=[QUEUE], limits=[1], owner="c")
        )
        assert acked == {first.id}
        assert _returns(lambda: relaxed.message_ack([second.tag], owner="c")) == {second.id}

        # Durable: the same claim waits for the standby, as a publish would.
        outcome: dict[str, Any] = {}

        def claim() -> None:
            outcome["claimed"] = durable.message_ack_claim(acks=[], queues=[QUEUE], limits=[1], owner="c")

        thread = threading.Thread(target=claim, daemon=True)
        thread.start()
        waiting: list[tuple[Any, ...]] = []

        def durable_waits() -> bool:
            waiting[:] = pg_server.execute("waiting_for_standby", {"app": "akadze-durable"})
            return bool(waiting)

        eventually(durable_waits, timeout=30, what="the durable claim's commit waits for the standby")
        assert thread.is_alive()
        pg_server.execute("cancel_pid", {"pid": waiting[0][0]})  # committed locally: the claim stands
        thread.join(30)
        (third,), _, _ = outcome["claimed"]
        assert third.id not in {first.id, second.id}
    finally:
        pg_server.execute("sync_standby_reset")
        pg_server.execute("reload")
        for store in (setup, relaxed, durable):
            store.close()
    check = Store(url, schema=SCHEMA, role="check")
    try:
        # The relaxed acks were committed (asynchronously), the durable claim too: 2 acked, 1 held, 1 ready.
        assert check.message_counts() == {(QUEUE, "held"): 1, (QUEUE, "ready"): 1}
    finally:
        check.close()
