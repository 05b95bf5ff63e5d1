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


def test_transient_publishes_skip_the_wal_flush_only_under_transient_async(pg_server: PgServer) -> None:
    """Injected: a synchronous standby that never connects. 6 publishes through kombu (4 to the queue, 2
    through a direct exchange): a transient one (delivery_mode=1) returns at once where transient_async
    is on; a persistent one there, and a transient one where the option is off (the default), wait for
    the standby like any durable commit (cancelled: committed locally). All 6 are in the queue after."""
    import kombu

    url = pg_server.url()
    migrate.apply(url, SCHEMA)
    exchange = kombu.Exchange("transient-x", type="direct", durable=True)
    queue = kombu.Queue(QUEUE, exchange=exchange, routing_key=QUEUE, durable=True)
    fast = kombu.Connection(
        f"akadze+{url}?application_name=akadze-fast",
        transport_options={"schema": SCHEMA, "transient_async": True},
    )
    default = kombu.Connection(f"akadze+{url}?application_name=akadze-default", transport_options={"schema": SCHEMA})
    try:
        fast_producer, default_producer = fast.Producer(), default.Producer()
        queue(fast.default_channel).declare()  # before the standby: a declare commits durably
        default.default_channel.queue_declare(QUEUE, passive=True)  # connects
        _require_standby(pg_server)

        def publish(producer: kombu.Producer, mode: int, *, through_exchange: bool = False) -> None:
            target = {"exchange": exchange, "routing_key": QUEUE} if through_exchange else {"routing_key": QUEUE}
            producer.publish({"mode": mode}, delivery_mode=mode, **target)

        _returns(lambda: publish(fast_producer, 1))
        _returns(lambda: publish(fast_producer, 1, through_exchange=True))

        def waits_for_standby(call: Callable[[], None], app: str) -> None:
            thread = threading.Thread(target=call, daemon=True)
            thread.start()
            waiting: list[tuple[Any, ...]] = []

            def found() -> bool:
                waiting[:] = pg_server.execute("waiting_for_standby", {"app": app})
                return bool(waiting)

            eventually(found, timeout=30, what=f"the publish of {app} waits for the standby")
            assert thread.is_alive()
            pg_server.execute("cancel_pid", {"pid": waiting[0][0]})  # committed locally: the message stands
            thread.join(30)
            assert not thread.is_alive()

        waits_for_standby(lambda: publish(fast_producer, 2), "akadze-fast")
        waits_for_standby(lambda: publish(fast_producer, 2, through_exchange=True), "akadze-fast")
        waits_for_standby(lambda: publish(default_producer, 1), "akadze-default")
        waits_for_standby(lambda: publish(default_producer, 1, through_exchange=True), "akadze-default")
    finally:
        pg_server.execute("sync_standby_reset")
        pg_server.execute("reload")
        fast.release()
        default.release()
    check = Store(url, schema=SCHEMA, role="check")
    try:
        assert check.message_counts() == {(QUEUE, "ready"): 6}
    finally:
        check.close()
