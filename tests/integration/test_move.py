"""`akadze move` against a real RabbitMQ: contents preserved, dry run, 10,000 messages, a mover killed mid-move."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import celery
import kombu
import pytest
from click.testing import CliRunner

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.ops import rabbitmq, stats
from kombu_akadze.ops.cli.main import akadze
from kombu_akadze.store import Store, migrate

AMQP_URL = os.environ.get("AKADZE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
AKADZE = Path(sys.executable).with_name("akadze")


@pytest.fixture(scope="module")
def rabbit() -> Iterator[kombu.Connection]:
    conn = kombu.Connection(AMQP_URL, connect_timeout=5)
    try:
        conn.ensure_connection(max_retries=0)
    except Exception as exc:
        pytest.skip(f"no RabbitMQ at {AMQP_URL}: {exc}")
    yield conn
    conn.release()


@pytest.fixture
def rabbit_queue(rabbit: kombu.Connection) -> Iterator[Callable[[], str]]:
    """Factory of uniquely named durable RabbitMQ queues, deleted afterwards."""
    made: list[str] = []

    def make() -> str:
        name = f"akadze_move_{uuid.uuid4().hex[:10]}"
        kombu.Queue(name, durable=True)(rabbit.default_channel).declare()
        made.append(name)
        return name

    yield make
    for name in made:
        rabbit.default_channel.queue_delete(name)


def depth(rabbit: kombu.Connection, queue: str) -> tuple[int, int]:
    """RabbitMQ's (ready messages, consumers) of a queue."""
    _, messages, consumers = rabbit.default_channel.queue_declare(queue=queue, passive=True)
    return int(messages), int(consumers)


def publish(rabbit: kombu.Connection, queue: str, ids: range) -> None:
    """Celery-shaped JSON messages whose header 'mid' is the id we track."""
    producer = rabbit.Producer(serializer="json")
    for i in ids:
        producer.publish(
            [[i], {}, {"callbacks": None}],
            routing_key=queue,
            headers={"task": "tests.work", "id": f"task-{i}", "mid": i},
            priority=i % 10,
            delivery_mode=2,
        )
    eventually(lambda: depth(rabbit, queue)[0] >= len(ids), timeout=60, what=f"{len(ids)} messages in {queue}")


def moved_ids(store: Store, queues: list[str]) -> Counter[int]:
    """The 'mid' header of every message in akadze (claimed to read them)."""
    store.consumer_heartbeat(consumer_id="reader", hostname="h", pid=1)
    got = store.message_claim(queues=queues, limits=[100_000] * len(queues), owner="reader")
    return Counter(int(m.headers["mid"]) for m in got)


def rows(store: Store) -> int:
    return sum(store.message_counts().values())


def test_move_preserves_body_headers_properties_priority_and_celery_eta(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store, make_connection: Any
) -> None:
    queue = rabbit_queue()
    app = celery.Celery("moved", broker=AMQP_URL)
    eta = datetime.now(UTC) + timedelta(hours=1)
    sent = app.send_task("tests.add", args=(2, 3), queue=queue, eta=eta, priority=5)
    binary = pickle.dumps({"nul": b"\x00\xff", "set": {1, 2}})
    rabbit.Producer().publish(
        binary,
        routing_key=queue,
        content_type="application/x-python-serialize",
        content_encoding="binary",
        headers={"nested": {"a": [1, 2]}, "n": 1.5, "flag": True},
        priority=200,
        correlation_id="c-1",
        reply_to="replies",
    )
    rabbit.Producer().publish(b"short-lived", routing_key=queue, expiration=60, priority=0)
    eventually(lambda: depth(rabbit, queue)[0] == 3, what="3 messages published")

    result = rabbitmq.move(AMQP_URL, store, [queue], idle=0.2)

    assert (result.total, result.moved, result.batches) == (3, {queue: 3}, 1)
    # The per-message expiration (60 s) became an akadze TTL: past it, only the other two are ready.
    (later,) = stats.queue_stats(store, now=datetime.now(UTC) + timedelta(seconds=120))
    assert later.ready == 2
    assert depth(rabbit, queue)[0] == 0
    channel = make_connection().channel()
    # Priority first: the binary message (200, clamped to akadze's 9) comes before the task (5).
    first, second = channel.basic_get(queue, no_ack=True), channel.basic_get(queue, no_ack=True)
    assert first.body == binary
    assert (first.content_type, first.content_encoding) == ("application/x-python-serialize", "binary")
    assert {k: first.headers[k] for k in ("nested", "n", "flag")} == {"nested": {"a": [1, 2]}, "n": 1.5, "flag": True}
    assert (first.properties["priority"], first.properties["correlation_id"], first.properties["reply_to"]) == (
        9,
        "c-1",
        "replies",
    )
    assert second.headers["task"] == "tests.add"
    assert (second.headers["id"], second.headers["eta"]) == (sent.id, eta.isoformat())
    assert second.properties["correlation_id"] == sent.id
    assert second.properties["priority"] == 5
    assert second.content_type == "application/json"
    assert second.decode()[0] == [2, 3]
    assert second.delivery_info["routing_key"] == queue


def test_dry_run_counts_and_leaves_every_message_in_rabbitmq(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store
) -> None:
    queue = rabbit_queue()
    publish(rabbit, queue, range(300))

    result = rabbitmq.move(AMQP_URL, store, [queue], dry_run=True, batch=50)

    assert (result.dry_run, result.total, result.moved, result.batches) == (True, 300, {queue: 300}, 0)
    assert rows(store) == 0
    eventually(lambda: depth(rabbit, queue) == (300, 0), timeout=30, what="every message back in RabbitMQ")


def test_move_of_10000_messages_from_two_queues_loses_nothing_and_copies_nothing(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store
) -> None:
    a, b = rabbit_queue(), rabbit_queue()
    publish(rabbit, a, range(6000))
    publish(rabbit, b, range(6000, 10_000))

    result = rabbitmq.move(AMQP_URL, store, [a, b])

    got = moved_ids(store, [a, b])
    print(f"\nmoved {result.total} in {result.seconds:.2f} s: {result.rate:.0f} msgs/s, {result.batches} batches")
    assert result.moved == {a: 6000, b: 4000}
    assert set(got) == set(range(10_000))
    assert max(got.values()) == 1
    assert depth(rabbit, a)[0] == depth(rabbit, b)[0] == 0


def test_a_mover_killed_mid_move_loses_nothing_and_repeats_at_most_one_batch(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store, tmp_path: Path
) -> None:
    queue = rabbit_queue()
    published = 10_000
    batch = 200
    publish(rabbit, queue, range(published))
    env = {**os.environ, "AKADZE_URL": store.dsn, "AKADZE_SCHEMA": store.schema}
    args = [str(AKADZE), "move", "--from", AMQP_URL, "--queues", queue, "--batch", str(batch)]

    with (tmp_path / "first.err").open("w") as err:
        # Throttled so that the kill lands while batches are still flowing.
        first = subprocess.Popen([*args, "--max-rate", "2000"], env=env, stdout=subprocess.DEVNULL, stderr=err)
        try:

            def committed_batches() -> bool:
                assert first.poll() is None, "the mover finished before it could be killed"
                return rows(store) >= 5 * batch

            eventually(committed_batches, timeout=60, what="five batches committed in akadze")
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
    assert first.returncode == -signal.SIGKILL
    at_kill = rows(store)
    # RabbitMQ requeues the dead mover's unacked deliveries once it sees the connection gone.
    eventually(lambda: depth(rabbit, queue)[1] == 0, timeout=30, what="the killed mover's consumer gone")

    started = time.monotonic()
    second = subprocess.run([*args, "--json"], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert second.returncode == 0, second.stderr
    rerun = json.loads(second.stdout)

    got = moved_ids(store, [queue])
    lost = set(range(published)) - set(got)
    duplicated = sum(n - 1 for n in got.values())
    print(
        f"\npublished {published}, in akadze at the kill {at_kill}, moved by the rerun {rerun['total']} "
        f"({rerun['rate']:.0f} msgs/s, {time.monotonic() - started:.1f} s with start-up), "
        f"total in akadze {sum(got.values())}, duplicated {duplicated}, lost {len(lost)}"
    )
    assert not lost
    assert duplicated <= batch
    assert sum(got.values()) >= published
    assert depth(rabbit, queue)[0] == 0


class CrashAfterCommit(Store):
    """A store whose process "dies" right after the n-th batch committed, before the mover can ack it."""

    def __init__(self, dsn: str, *, schema: str, crash_on: int) -> None:
        super().__init__(dsn, schema=schema, role="crashing")
        self.crash_on = crash_on
        self.batches = 0

    def message_insert_many(self, messages: Any, *, now: datetime | None = None) -> int:
        n = super().message_insert_many(messages, now=now)
        self.batches += 1
        if self.batches == self.crash_on:
            raise KeyboardInterrupt("simulated crash between commit and ack")
        return n


def test_a_crash_between_commit_and_ack_repeats_exactly_that_batch_and_loses_nothing(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store
) -> None:
    queue = rabbit_queue()
    publish(rabbit, queue, range(1000))
    crashing = CrashAfterCommit(store.dsn, schema=store.schema, crash_on=3)
    with pytest.raises(KeyboardInterrupt):
        rabbitmq.move(AMQP_URL, crashing, [queue], batch=100, idle=0.2)
    crashing.close()
    assert rows(store) == 300
    eventually(lambda: depth(rabbit, queue) == (800, 0), timeout=30, what="the unacked batch back in RabbitMQ")

    rabbitmq.move(AMQP_URL, store, [queue], batch=100, idle=0.2)

    got = moved_ids(store, [queue])
    assert set(got) == set(range(1000))
    assert sum(n - 1 for n in got.values()) == 100


def test_a_batch_postgresql_refuses_is_not_acked_and_stays_in_rabbitmq(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store
) -> None:
    queue = rabbit_queue()
    publish(rabbit, queue, range(25))
    # jsonb cannot hold a NUL character: the batch holding this message fails to insert.
    rabbit.Producer(serializer="json").publish({}, routing_key=queue, headers={"mid": 25, "bad": "a\x00b"})
    publish(rabbit, queue, range(26, 30))
    eventually(lambda: depth(rabbit, queue)[0] == 30, what="30 messages published")

    with pytest.raises(rabbitmq.MoveError, match=r"moving stopped after 20 message\(s\).*not acked"):
        rabbitmq.move(AMQP_URL, store, [queue], batch=10, idle=0.2)

    assert set(moved_ids(store, [queue])) == set(range(20))
    eventually(lambda: depth(rabbit, queue) == (10, 0), timeout=30, what="the failed batch back in RabbitMQ")


def test_move_cli_reports_json_and_refuses_bad_input_with_exit_2(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store
) -> None:
    queue = rabbit_queue()
    publish(rabbit, queue, range(20))
    env = {"AKADZE_URL": store.dsn, "AKADZE_SCHEMA": store.schema}
    runner = CliRunner()

    def run(*args: str) -> Any:
        return runner.invoke(akadze, ["move", *args], env=env)

    done = run("--from", AMQP_URL, "--queues", queue, "--batch", "7", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.stdout)["moved"] == {queue: 20}
    assert json.loads(done.stdout)["batches"] == 3

    missing = run("--from", AMQP_URL, "--queues", f"{queue},no_such_queue_here")
    assert missing.exit_code == 2
    assert "has no queue 'no_such_queue_here'" in missing.output

    wrong_login = run("--from", "amqp://guest:n0tthis@127.0.0.1:5672//", "--queues", queue)
    assert wrong_login.exit_code == 2
    assert "n0tthis" not in wrong_login.output
    assert "amqp://guest:**@127.0.0.1:5672//" in wrong_login.output

    not_amqp = run("--from", "redis://localhost:6379/0", "--queues", queue)
    assert not_amqp.exit_code == 2
    assert "use amqp://user:password@host:5672/vhost" in not_amqp.output


def test_move_into_a_database_without_the_schema_migrates_it_first_unless_no_migrate(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], pg_url: str, schema: str
) -> None:
    """As the transport's auto_migrate: `akadze move` into an empty database creates the schema; with
    --no-migrate (a least-privilege role) it says what to run instead, and RabbitMQ keeps the messages."""
    queue = rabbit_queue()
    publish(rabbit, queue, range(3))
    fresh = f"{schema}_mv"
    args = ["move", "--from", AMQP_URL, "--queues", queue, "--url", pg_url, "--schema", fresh]
    try:
        refused = CliRunner().invoke(akadze, [*args, "--no-migrate"])
        assert refused.exit_code == 2, refused.output
        assert "akadze migrate" in refused.output
        assert depth(rabbit, queue)[0] == 3
        moved = CliRunner().invoke(akadze, [*args, "--json"])
        assert moved.exit_code == 0, moved.output
        assert json.loads(moved.stdout[moved.stdout.index("{") :])["total"] == 3
        assert migrate.status(pg_url, fresh).up_to_date
    finally:
        migrate.drop(pg_url, fresh)
        migrate.forget_checks()


def test_a_dry_run_from_the_cli_says_counted_on_stderr_never_moved(
    rabbit: kombu.Connection, rabbit_queue: Callable[[], str], store: Store
) -> None:
    queue = rabbit_queue()
    publish(rabbit, queue, range(30))

    result = CliRunner().invoke(
        akadze,
        ["move", "--from", AMQP_URL, "--queues", queue, "--dry-run"],
        env={"AKADZE_URL": store.dsn, "AKADZE_SCHEMA": store.schema},
    )

    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"would move 30 message(s) ({queue}: 30)")
    assert result.stderr.startswith("counted ")
    assert "moved" not in result.stderr
    assert rows(store) == 0
