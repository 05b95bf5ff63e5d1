"""The host's wake-up relay on a real server: of three consumers of one host, one session LISTENs, on all
three channels; a publish to a queue one of the others is parked on reaches that one through the hub (the
message handed over, or a wake-up); and kombu consumers in one process share the hub as Celery workers on
one host do."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kombu_akadze.consume import relay
from kombu_akadze.consume.listener import Listener
from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import ClaimedMessage, NewMessage, Store, relay_key, sqlfiles, wake_channel
from tests.conftest import store_for

pytestmark = pytest.mark.skipif(not relay.supported(), reason="the wake-up relay needs Linux's abstract sockets")

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())


def listening_channels(store: Store) -> list[str]:
    return [r[0] for r in store.connection().execute(SQL["listening_channels"]).fetchall()]


class Consumer:
    def __init__(self, pg_url: str, schema: str, name: str) -> None:
        self.name = name
        self.session = store_for(pg_url, schema)
        self.woken = 0
        self.handed: list[ClaimedMessage] = []
        self.listener = Listener(
            self.session,
            channel=wake_channel(schema, name),
            enabled=True,
            on_wakeup=self._woke,
            on_handoff=lambda message, _parked: self.handed.append(message),
            relay_key=relay_key(self.session.dsn, schema),
        )
        self.listener.arm()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _woke(self) -> None:
        self.woken += 1

    def _pump(self) -> None:
        while not self._stop.is_set():
            self.listener.wait(0.05)

    def pause(self) -> None:
        """Stop the heartbeat thread's waits (the session is then the test's to query: in a worker only
        that thread uses it)."""
        self._stop.set()
        self.listener.interrupt()
        self._thread.join(10)

    def resume(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.pause()
        self.listener.close()
        self.session.close()


def test_one_session_listens_for_the_host_and_relays_each_wakeup_to_its_consumer(
    pg_url: str, schema: str, store: Store
) -> None:
    consumers = [Consumer(pg_url, schema, name) for name in ("a", "b", "c")]
    try:
        hub, b, c = consumers
        assert [x.listener.role for x in consumers] == ["hub", "linked", "linked"]
        eventually(lambda: b.listener.armed and c.listener.armed, timeout=10, what="armed through the hub")
        channels = sorted(wake_channel(schema, x.name) for x in consumers)
        # Ask the hub's own session which channels it LISTENs on, its thread paused (b and c armed: the hub
        # ran their LISTEN before it told them).
        hub.pause()
        assert listening_channels(hub.session) == channels
        hub.resume()
        assert listening_channels(b.session) == []
        assert listening_channels(c.session) == []

        # b parks on q, as a claim that came back empty parks it; a publish to q hands b its message, through
        # the hub, and nobody else hears of it.
        outcome = store.message_ack_claim(acks=[], queues=["q"], limits=[1], owner="b", park=b.listener.channel)
        assert outcome.claimed == []
        before = [x.woken for x in consumers]
        store.message_insert(NewMessage(queue="q", body=b"one", headers={"h": "x" * 3000}))
        eventually(lambda: b.handed, timeout=10, what="b handed its message through the hub")
        [message] = b.handed
        assert (message.queue, message.body, message.headers, message.run_count) == ("q", b"one", {"h": "x" * 3000}, 1)
        row = store.message_get(message.id)
        assert row is not None
        assert (row["state"], row["owner"]) == ("held", "b")  # b's since the publish
        assert [x.woken for x in consumers] == before
        assert (hub.listener.relayed, b.listener.handoffs, b.listener.wakeups) == (1, 1, 0)
        assert hub.handed == c.handed == []

        # A batch publish wakes (it does not hand over): b, parked again, is woken through the hub.
        store.message_ack_claim(acks=[message.tag], queues=["q"], limits=[1], owner="b", park=b.listener.channel)
        store.message_insert_many([NewMessage(queue="q", body=b"two")])
        eventually(lambda: b.woken > before[1], timeout=10, what="b woken through the hub")
        assert (hub.woken, c.woken) == (before[0], before[2])
        assert (hub.listener.relayed, b.listener.wakeups) == (2, 1)
    finally:
        for consumer in consumers:
            consumer.close()


def test_kombu_consumers_of_one_process_share_the_hub_and_are_woken(make_connection: Any) -> None:
    got: list[Any] = []
    conns = [make_connection(poll_interval=60, listen_poll_interval=60, heartbeat_interval=30, heartbeat_ttl=60)]
    conns.append(make_connection(poll_interval=60, listen_poll_interval=60, heartbeat_interval=30, heartbeat_ttl=60))
    consumers = []
    for i, conn in enumerate(conns):
        queue = conn.SimpleQueue(f"relay{i}")
        consumers.append(queue)
    for queue in consumers:  # each claims once, finds nothing, and parks
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.5)
    roles = sorted(conn.transport.listener.role for conn in conns)
    assert roles == ["hub", "linked"]
    publisher = make_connection()
    for i, queue in enumerate(consumers):
        publisher.SimpleQueue(f"relay{i}").put({"n": i})
        # Neither the poll (60 s) nor a heartbeat (30 s) comes within the deadline: the wake-up does it.
        message = queue.get(timeout=20)
        got.append(message.payload)
        message.ack()
    assert got == [{"n": 0}, {"n": 1}]
    for queue in consumers:
        queue.close()
