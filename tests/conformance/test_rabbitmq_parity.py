"""kombu's Connection/SimpleQueue/Producer/Consumer API run against akadze AND RabbitMQ (pyamqp) in the same
run, asserting the same results; where RabbitMQ itself differs from akadze, the test says so."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from queue import Empty
from typing import Any
from urllib.parse import urlsplit

import kombu
import pytest
from kombu import Queue

from kombu_akadze.integrations.testing import eventually

AMQP_URL = os.environ.get("AKADZE_TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
PUBLISHED = {"h-str": "v", "h-int": 7, "h-bool": True, "h-list": [1, "a"], "h-map": {"k": "v"}}
#: AMQP basic properties a producer sets and both brokers hand back as they were.
PROPERTIES = {"correlation_id": "c-1", "reply_to": "replies", "message_id": "m-1", "type": "t", "app_id": "app"}


@dataclass
class Broker:
    name: str
    url: str
    scheme: str
    default_port: int
    transport_options: dict[str, Any] = field(default_factory=dict)
    made: list[kombu.Connection] = field(default_factory=list)
    queues: list[str] = field(default_factory=list)

    def connection(self, url: str | list[str] | None = None, **kwargs: Any) -> kombu.Connection:
        conn = kombu.Connection(url or self.url, transport_options=dict(self.transport_options), **kwargs)
        self.made.append(conn)
        return conn

    def queue(self, **arguments: Any) -> Queue:
        name = f"parity-{uuid.uuid4().hex[:10]}"
        self.queues.append(name)
        return Queue(name, queue_arguments=arguments or None)

    def url_at(self, port: int) -> str:
        parts = urlsplit(self.url)
        return self.url.replace(f"@{parts.hostname}:{parts.port}", f"@{parts.hostname}:{port}", 1)

    @property
    def parts(self) -> Any:
        return urlsplit(self.url)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(params=["akadze", "rabbitmq"])
def broker(request: pytest.FixtureRequest, pg_url: str) -> Iterator[Broker]:
    if request.param == "rabbitmq":
        probe = kombu.Connection(AMQP_URL, connect_timeout=5)
        try:
            probe.ensure_connection(max_retries=0)
        except Exception as exc:
            pytest.skip(f"no RabbitMQ at {AMQP_URL}: {exc}")
        finally:
            probe.release()
        b = Broker("rabbitmq", AMQP_URL, "amqp", 5672)
    else:
        schema = request.getfixturevalue("schema")
        pg = request.getfixturevalue("tcp_pg")
        url = f"akadze://{pg.netloc if pg.port else pg.netloc + ':5432'}{pg.path}"
        b = Broker("akadze", url, "akadze", 5432, {"schema": schema, "heartbeat_interval": 0.25, "heartbeat_ttl": 2})
    yield b
    if b.name == "rabbitmq" and b.queues:
        with kombu.Connection(AMQP_URL) as conn:
            for name in b.queues:
                conn.default_channel.queue_delete(name)
    for conn in b.made:
        conn.release()


def get(conn: kombu.Connection, queue: Queue, timeout: float = 20) -> kombu.Message:
    simple = conn.SimpleQueue(queue)
    try:
        return simple.get(timeout=timeout)
    finally:
        simple.consumer.cancel()


def test_headers_and_properties_come_back_as_published(broker: Broker) -> None:
    conn = broker.connection()
    queue = broker.queue()
    producer = conn.Producer()
    # A keyword neither broker can send (Celery's signal object from **kwargs): ignored, never a failure.
    producer.publish(
        {"n": 1}, routing_key=queue.name, declare=[queue], headers=PUBLISHED, signal=object(), **PROPERTIES
    )
    simple = conn.SimpleQueue(queue)
    msg = simple.get(timeout=20)
    assert msg.headers == PUBLISHED
    assert {k: msg.properties.get(k) for k in PROPERTIES} == PROPERTIES
    assert "signal" not in msg.properties
    assert msg.content_type == "application/json"
    assert msg.delivery_info["redelivered"] is False
    assert msg.delivery_info["routing_key"] == queue.name
    msg.reject(requeue=True)
    again = simple.get(timeout=20)
    assert again.delivery_info["redelivered"] is True
    assert again.payload == {"n": 1}
    if broker.name == "rabbitmq":  # a classic queue adds nothing on a redelivery
        assert again.headers == PUBLISHED
    else:  # akadze adds what a RabbitMQ quorum queue adds on a redelivery
        assert again.headers == {**PUBLISHED, "x-delivery-count": 1}
    again.ack()
    simple.close()


def test_simple_queue_and_simple_buffer(broker: Broker) -> None:
    conn = broker.connection()
    queue = broker.queue()
    producer = conn.Producer()
    for i in range(3):
        producer.publish({"i": i}, routing_key=queue.name, declare=[queue])
    eventually(lambda: queue(conn.default_channel).queue_declare().message_count == 3, timeout=20, what="counted")
    simple = conn.SimpleQueue(queue)
    got = []
    for _ in range(3):
        msg = simple.get(timeout=20)
        got.append(msg.payload["i"])
        msg.ack()
    assert got == [0, 1, 2]
    with pytest.raises(Empty):
        simple.get_nowait()
    simple.close()

    purged = broker.queue()
    for i in range(2):
        producer.publish({"i": i}, routing_key=purged.name, declare=[purged])
    eventually(lambda: purged(conn.default_channel).queue_declare().message_count == 2, timeout=20, what="counted")
    assert purged(conn.default_channel).purge() == 2

    name = broker.queue().name
    buffer = conn.SimpleBuffer(name)
    buffer.put({"b": 1})
    assert buffer.get(timeout=20).payload == {"b": 1}  # no_ack: nothing to acknowledge
    with pytest.raises(Empty):
        buffer.get(timeout=0.5)
    buffer.close()


def test_higher_priority_first(broker: Broker) -> None:
    conn = broker.connection()
    queue = broker.queue(**{"x-max-priority": 10})
    producer = conn.Producer()
    for priority in (1, 9, 5):
        producer.publish({"p": priority}, routing_key=queue.name, declare=[queue], priority=priority)
    eventually(lambda: queue(conn.default_channel).queue_declare().message_count == 3, timeout=20, what="queued")
    simple = conn.SimpleQueue(queue)
    got = []
    for _ in range(3):
        msg = simple.get(timeout=20)
        got.append(msg.payload["p"])
        msg.ack()
    simple.close()
    assert got == [9, 5, 1]


def test_expired_messages_are_not_delivered(broker: Broker) -> None:
    conn = broker.connection()
    queue = broker.queue()
    producer = conn.Producer()
    producer.publish({"n": "expires"}, routing_key=queue.name, declare=[queue], expiration=0.3)
    producer.publish({"n": "stays"}, routing_key=queue.name)
    ttl_queue = broker.queue(**{"x-message-ttl": 300})
    producer.publish({"n": "queue ttl"}, routing_key=ttl_queue.name, declare=[ttl_queue])

    def expired_gone() -> bool:
        # Neither broker counts (nor delivers) an expired message; akadze removes its row later, in the
        # elected consumer's message_expire pass.
        left = queue(conn.default_channel).queue_declare().message_count
        return (left, ttl_queue(conn.default_channel).queue_declare().message_count) == (1, 0)

    eventually(expired_gone, timeout=30, what="the expired messages gone")
    msg = get(conn, queue)
    assert msg.payload == {"n": "stays"}
    msg.ack()


@pytest.mark.parametrize("how", ["semicolons", "list", "alternates"])
def test_failover_to_an_alternate(broker: Broker, how: str) -> None:
    dead = broker.url_at(free_port())
    if how == "semicolons":
        conn = broker.connection(f"{dead};{broker.url}", connect_timeout=5)
    elif how == "list":
        conn = broker.connection([dead, broker.url], connect_timeout=5)
    else:
        conn = broker.connection(dead, alternates=[broker.url], connect_timeout=5)
    conn.ensure_connection(max_retries=6, interval_start=0, interval_step=0.1, interval_max=0.2)
    assert (conn.hostname, conn.port) == (broker.parts.hostname, broker.parts.port)
    queue = broker.queue()
    conn.Producer().publish({"after": "failover"}, routing_key=queue.name, declare=[queue])
    msg = get(conn, queue)
    assert msg.payload == {"after": "failover"}
    msg.ack()


def test_connection_attributes(broker: Broker) -> None:
    conn = broker.connection()
    conn.connect()
    parts = broker.parts
    assert (conn.hostname, conn.port, conn.userid) == (parts.hostname, parts.port, parts.username)
    assert conn.connected
    assert conn.as_uri().startswith(f"{broker.scheme}://{parts.username}")
    if parts.password:
        assert ":**@" in conn.as_uri()
        assert f":{parts.password}@" in conn.as_uri(include_password=True)
