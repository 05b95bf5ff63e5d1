"""A process that exits without closing its connection (Celery's CLI clients, a script that got a result)
forgets its consumer row at exit while it holds nothing, so `akadze stats` and `akadze_consumers_alive`
stop counting it at once; one that holds a message keeps its row until rescue, and a forked child's exit
never removes its parent's row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kombu_akadze.ops import stats
from kombu_akadze.store import NewMessage, Store

CLIENT = Path(__file__).with_name("exiting_client.py")


def run_client(pg_url: str, store: Store, mode: str) -> list[str]:
    store.message_insert(NewMessage(queue="exiting", body=b'"x"', content_type="application/json"))
    done = subprocess.run(
        [sys.executable, str(CLIENT), pg_url, store.schema, mode],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def alive(store: Store) -> int:
    return stats.snapshot(store, ttl=60).consumers_alive


def test_a_client_that_exits_holding_nothing_is_not_counted_alive_after_it_exits(pg_url: str, store: Store) -> None:
    run_client(pg_url, store, "ack")
    assert alive(store) == 0
    assert sum(store.message_counts().values()) == 0


def test_a_client_that_exits_with_a_message_unsettled_gives_it_back_and_is_forgotten(pg_url: str, store: Store) -> None:
    run_client(pg_url, store, "hold")
    assert alive(store) == 0
    [queue] = stats.queue_stats(store, ttl=60)
    assert (queue.ready, queue.held) == (1, 0)  # back in place by kombu's exit hook, before the row went


def test_a_consumer_holding_a_message_is_not_forgotten_at_exit(store: Store) -> None:
    store.message_insert(NewMessage(queue="exiting", body=b"x"))
    store.consumer_heartbeat(consumer_id="holder", hostname="h", pid=1)
    [held] = store.message_claim(queues=["exiting"], limits=[1], owner="holder")

    assert store.consumer_delete_idle(consumer_id="holder") is False
    assert alive(store) == 1
    store.message_ack([held.tag], owner="holder")
    assert store.consumer_delete_idle(consumer_id="holder") is True
    assert alive(store) == 0


def test_a_forked_child_exiting_leaves_its_parents_row_alone(pg_url: str, store: Store) -> None:
    after_child, _consumer = run_client(pg_url, store, "fork")
    assert after_child == "1"  # the parent still counted while it lived
    assert alive(store) == 0  # and forgotten at its own exit
