"""A PostgreSQL server with autovacuum off (as some CI and hand-tuned servers run): the workers vacuum the
messages table themselves, so dead rows from claims and acks do not pile up; with autovacuum on they
leave it to the server."""

from __future__ import annotations

import pytest

from kombu_akadze.store import NewMessage

from .checker import verdict
from .conftest import SCHEMA, Faults
from .jobs import TOUCH

OPTIONS = {"heartbeat_interval": 0.5, "heartbeat_ttl": 5.0, "rescue_interval": 0.5}
#: Each task leaves two dead rows (claim, ack): 4,000 tasks leave 8,000, past the 5,000 that call for a VACUUM.
TASKS = 4_000


def _dead_and_vacuumed(own: Faults) -> tuple[int, object]:
    assert own.server is not None
    rows = own.server.execute("vacuum_stats", {"schema": SCHEMA})
    return int(rows[0][0]), rows[0][1]


@pytest.mark.slow
def test_with_autovacuum_off_the_workers_vacuum_the_messages_table_and_lose_nothing(own: Faults) -> None:
    server = own.server
    assert server is not None
    # Autovacuum on (the server's default): the maintenance pass reports nothing for consumers to vacuum.
    store = own.store
    store.message_insert_many([NewMessage(queue="scratch", body=b"x") for _ in range(100)])
    store.consumer_heartbeat(consumer_id="probe", hostname="h", pid=1)
    claimed = store.message_claim(queues=["scratch"], limits=[100], owner="probe")
    store.message_ack([m.tag for m in claimed], owner="probe")
    assert store.messages_unvacuumed() == 0

    server.stop("fast")
    server.extra_options = "-c autovacuum=off"
    server.start()
    store.close()  # its session ended with the server; the next call opens one

    own.options = OPTIONS
    worker = own.start_worker("a", concurrency=2)
    app = own.producer()
    numbers = range(TASKS)
    own.publish_many(app, TOUCH, [([n], {}) for n in numbers])
    own.until(lambda: own.ledgers.all_done(numbers), timeout=600, interval=0.5, what=f"{TASKS} tasks done")
    own.until(
        lambda: _dead_and_vacuumed(own)[1] is not None,
        timeout=120,
        interval=0.5,
        what="a worker vacuumed the messages table",
    )
    dead, vacuumed_at = _dead_and_vacuumed(own)
    print(f"autovacuum off: {TASKS} tasks, dead rows after the workers' VACUUM {dead}, at {vacuumed_at}")
    assert "autovacuum is off on this PostgreSQL server" in worker.output()

    result = verdict(
        "autovacuum off on the server",
        injected="-c autovacuum=off; 4,000 tasks (8,000 dead rows)",
        published=numbers,
        ledgers=own.ledgers,
        recovery=None,
    )
    assert result.lost == 0
    assert worker.alive
