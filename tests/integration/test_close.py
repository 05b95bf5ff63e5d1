"""Closing a connection whose buffered outcomes cannot be written: the close still happens (channels
closed, held messages released, heartbeat stopped, consumer row gone)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from kombu import Queue
from kombu.simple import SimpleQueue

from kombu_akadze import sqlfiles
from kombu_akadze.errors import AkadzeError
from kombu_akadze.store import Store

SQL = sqlfiles.parse_blocks(Path(__file__).with_name("inspect.sql").read_text())

#: Slow beats: after the first pass, nothing on the heartbeat thread writes outcomes during the test.
SLOW_BEATS = {"heartbeat_interval": 30, "heartbeat_ttl": 60, "rescue_interval": 30}


def _run(store: Store, name: str) -> Any:
    query = SQL[name].replace("{schema}", sqlfiles.quote_ident(store.schema))
    cur = store.connection().execute(query)
    return cur.fetchone() if cur.description else None


def _heartbeat_threads(consumer_id: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"akadze-heartbeat-{consumer_id}"]


@pytest.mark.parametrize("channel", ["default", "own"])
def test_a_non_transient_error_flushing_outcomes_at_close_still_closes_and_stops_the_heartbeat(
    make_connection: Any, store: Store, channel: str
) -> None:
    """kombu closes the default channel first (Channel.close flushes), then the transport closes the
    others (close_connection flushes): an error in either flush must not skip the rest of the close."""
    conn = make_connection(**SLOW_BEATS)
    producer = conn.Producer()
    for n in range(3):
        producer.publish({"n": n}, routing_key="closing", declare=[Queue("closing")])
    simple = SimpleQueue(conn.default_channel if channel == "default" else conn.channel(), "closing")
    first = simple.get(timeout=10)  # the claim took all three: one delivered, two buffered
    transport = conn.transport
    heartbeat = transport.heartbeat
    assert heartbeat.wait_for(lambda h: h.rescues >= 1, timeout=30)  # its first pass is behind it
    consumer_id = transport.consumer_id
    _run(store, "ack_function_drop")
    first.ack()  # buffered (a draining consumer writes it with its next claim, or at close)
    assert simple.channel.qos.pending == 1

    error: AkadzeError | None = None
    try:
        conn.release()
    except AkadzeError as exc:  # the flush's error must be logged, not skip the close
        error = exc

    assert not heartbeat.running, "the heartbeat still beats"
    assert not _heartbeat_threads(consumer_id), "the heartbeat thread is still alive"
    assert _run(store, "consumer_count")[0] == 0, "the consumer row is still there"
    # The two buffered messages went back in place; the acked one, whose ack could not be written,
    # is held by a consumer that is gone: the next rescue pass of anyone gives it back (one more run).
    assert store.message_counts() == {("closing", "ready"): 2, ("closing", "held"): 1}
    later = datetime.now(UTC) + timedelta(seconds=61)
    counts = store.consumer_maintain(
        consumer_id="rescuer", hostname="h", pid=1, queues=[], ttl=60, max_attempts=20, now=later
    ).counts
    assert counts["requeued"] == 1
    assert store.message_counts() == {("closing", "ready"): 3}
    assert error is None, f"close raised {error!r}"
