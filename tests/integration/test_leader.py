"""One elected consumer runs the fleet's maintenance; the others only beat, and one takes over when it dies."""

from __future__ import annotations

import time
from typing import Any

import pytest

from kombu_akadze.store import Store

STEADY = {"heartbeat_interval": 0.25, "rescue_interval": 0.25, "heartbeat_ttl": 10.0}


def consume(conn: Any, queue: str) -> Any:
    """Register *conn* as a consumer of *queue* (a get that finds nothing starts its heartbeat)."""
    q = conn.SimpleQueue(queue)
    with pytest.raises(q.Empty):
        q.get(timeout=0.1)
    return q


def test_only_the_oldest_live_consumer_runs_the_fleets_maintenance(make_connection: Any) -> None:
    conns = [make_connection(**STEADY) for _ in range(3)]
    queues = [consume(conn, "fleet") for conn in conns]
    beats = [conn.transport.heartbeat for conn in conns]
    for hb in beats:
        assert hb.wait_for(lambda h: h.rescues >= 8, timeout=60)
    elected, *others = beats
    print(f"maintenance rounds led: {[hb.led for hb in beats]} of {[hb.rescues for hb in beats]}")
    assert elected.led >= 1
    assert [hb.led for hb in others] == [0, 0]
    for q in queues:
        q.close()


def test_a_dead_leaders_messages_are_rescued_by_the_consumer_that_takes_over(
    make_connection: Any, store: Store
) -> None:
    leader = make_connection()  # FAST timings: heartbeat_ttl 2 s
    lq = leader.SimpleQueue("handover")
    lq.put({"n": 1})
    held = lq.get(timeout=10)
    assert leader.transport.heartbeat.wait_for(lambda h: h.led >= 1, timeout=30)
    follower = make_connection()
    fq = consume(follower, "handover")
    fhb = follower.transport.heartbeat
    assert fhb.wait_for(lambda h: h.rescues >= 2, timeout=30)
    assert fhb.led == 0

    leader.transport.heartbeat.stop()  # dies without a word: its consumer row and its held message stay
    died = time.monotonic()
    assert fhb.wait_for(lambda h: h.led >= 1, timeout=60)
    took_over = time.monotonic() - died
    redelivered = fq.get(timeout=60)
    print(
        f"injected: the elected consumer's heartbeat stopped; took over after {took_over:.2f} s "
        f"(heartbeat_ttl {fhb.ttl} s); 1 message held, 1 redelivered, lost 0"
    )
    assert redelivered.payload == {"n": 1}
    assert redelivered.delivery_info["redelivered"] is True
    assert took_over < fhb.ttl + 30  # within the ttl plus the next rounds, with room for a loaded machine
    redelivered.ack()
    assert held is not None
    fq.close()
