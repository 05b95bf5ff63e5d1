"""Moving a RabbitMQ backlog into akadze: drain queues with kombu (pyamqp), ack only what PostgreSQL committed."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TextIO

from amqp import exceptions as amqp_exceptions
from kombu.connection import Connection
from kombu.exceptions import OperationalError as KombuOperationalError

from kombu_akadze.errors import AkadzeError, ConfigurationError
from kombu_akadze.store import NewMessage
from kombu_akadze.urls import mask_password

if TYPE_CHECKING:
    from kombu_akadze.store import Store

logger = logging.getLogger("kombu_akadze")

#: Messages per INSERT (and per RabbitMQ ack): a crash duplicates at most one batch.
DEFAULT_BATCH = 500
#: Seconds without a delivery after which a queue counts as drained (if RabbitMQ agrees).
DEFAULT_IDLE = 1.0
#: kombu's virtual transports (akadze included) know priorities 0..9.
MAX_PRIORITY = 9
SCHEMES = ("amqp://", "amqps://", "pyamqp://")

# AMQP basic properties that become columns or headers rather than stored properties.
_COLUMN_PROPERTIES = ("content_type", "content_encoding", "application_headers")


class MoveError(AkadzeError):
    """RabbitMQ refused or lost the connection, or a named queue is not there."""


@dataclass(frozen=True)
class Progress:
    moved: int
    expected: int
    seconds: float
    per_queue: dict[str, int]

    @property
    def rate(self) -> float:
        return self.moved / self.seconds if self.seconds > 0 else 0.0


@dataclass
class MoveResult:
    """What a move (or a dry run: nothing moved, ``moved`` counts what would be) did."""

    dry_run: bool
    queues: Sequence[str]
    moved: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    batches: int = 0
    #: Seconds from the start until the last batch committed (the final wait for "drained" excluded).
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.moved.values())

    @property
    def rate(self) -> float:
        return self.total / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "moved": dict(self.moved),
            "total": self.total,
            "bytes": self.bytes,
            "batches": self.batches,
            "seconds": round(self.seconds, 3),
            "rate": round(self.rate, 1),
        }


class ProgressPrinter:
    """A progress callback: moved/expected and rate, at most twice a second; one rewritten line on a terminal.
    A dry run moves nothing, so its lines say "counted"."""

    def __init__(self, stream: TextIO, *, every: float = 0.5, dry_run: bool = False) -> None:
        self.stream = stream
        self.verb = "counted" if dry_run else "moved"
        self.every = every
        self.tty = stream.isatty()
        self.last = 0.0
        self.shown = False

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if now - self.last < self.every:
            return
        self.last = now
        line = f"{self.verb} {p.moved}/{p.expected} in {p.seconds:.1f} s, {p.rate:.0f} msgs/s"
        self.stream.write(f"\r{line}" if self.tty else f"{line}\n")
        self.stream.flush()
        self.shown = True

    def done(self) -> None:
        if self.tty and self.shown:
            self.stream.write("\n")
            self.stream.flush()


def to_new_message(queue: str, message: Any) -> NewMessage:
    """The akadze message for one delivered ``amqp.Message``: body bytes, headers, content type and
    encoding, priority, per-message expiration (as a TTL from now) and the remaining AMQP properties
    as they were (a Celery ``eta`` stays a header: the worker waits for it, as on RabbitMQ)."""
    props = dict(message.properties or {})
    content_type = props.get("content_type")
    content_encoding = props.get("content_encoding")
    headers = dict(props.get("application_headers") or {})
    for name in _COLUMN_PROPERTIES:
        props.pop(name, None)
    body = message.body if message.body is not None else b""
    if isinstance(body, str):  # only if someone turned on amqp's auto_decode
        body = body.encode(content_encoding or "utf-8")
    try:
        priority = min(max(int(props.get("priority") or 0), 0), MAX_PRIORITY)
    except (TypeError, ValueError):
        priority = 0
    info = message.delivery_info or {}
    props["priority"] = priority
    props["delivery_info"] = {"exchange": info.get("exchange", ""), "routing_key": info.get("routing_key", queue)}
    return NewMessage(
        queue=queue,
        body=bytes(body),
        priority=priority,
        content_type=content_type,
        content_encoding=content_encoding,
        headers=headers,
        properties=props,
        ttl=_expiration(props.get("expiration")),
    )


def _expiration(value: Any) -> float | None:
    """AMQP per-message expiration (milliseconds, a string) in seconds; counted again from the move."""
    try:
        ms = float(value)
    except (TypeError, ValueError):
        return None
    return ms / 1000.0 if ms >= 0 else None


def check_url(url: str) -> str:
    if not url.startswith(SCHEMES):
        raise ConfigurationError(
            f"not a RabbitMQ URL: {mask_password(url)!r}; use amqp://user:password@host:5672/vhost "
            "(amqps:// for TLS; the default vhost is written amqp://host:5672//)"
        )
    return url


class Mover:
    """One RabbitMQ connection draining *queues* into *store*; use move() for the whole job."""

    def __init__(
        self,
        source_url: str,
        store: Store,
        queues: Sequence[str],
        *,
        batch: int = DEFAULT_BATCH,
        idle: float = DEFAULT_IDLE,
        max_rate: float | None = None,
        connect_timeout: float = 10.0,
        progress: Callable[[Progress], None] | None = None,
    ) -> None:
        if batch < 1:
            raise ConfigurationError(f"batch must be >= 1 message, got {batch}")
        if max_rate is not None and max_rate <= 0:
            raise ConfigurationError(f"max_rate must be > 0 messages per second, got {max_rate}")
        if not queues:
            raise ConfigurationError("name at least one RabbitMQ queue to move")
        self.url = check_url(source_url)
        self.store = store
        self.queues = list(dict.fromkeys(queues))
        self.batch = batch
        self.idle = idle
        self.max_rate = max_rate
        self.progress = progress
        # kombu is untyped: its connection is Any here rather than an ignore on every call.
        self.conn: Any = Connection(source_url, connect_timeout=connect_timeout)  # type: ignore[no-untyped-call]
        self.pending: list[tuple[str, Any]] = []
        self.expected = 0
        self.started = 0.0

    # -- connection -----------------------------------------------------------

    def connect(self) -> None:
        try:
            self.conn.ensure_connection(max_retries=0)
        except (KombuOperationalError, OSError, amqp_exceptions.AMQPError) as exc:
            raise MoveError(f"cannot connect to RabbitMQ at {mask_password(self.url)}: {exc}") from exc

    def close(self) -> None:
        try:
            self.conn.release()  # unacked deliveries go back to their queues
        except (OSError, amqp_exceptions.AMQPError) as exc:
            logger.warning("kombu-akadze move: closing the RabbitMQ connection: %s", exc)

    def depth(self, queue: str) -> int:
        """Ready messages of one RabbitMQ queue (a passive declare, on a channel of its own)."""
        channel = self.conn.channel()
        try:
            _, count, _ = channel.queue_declare(queue=queue, passive=True)
            return int(count)
        except amqp_exceptions.NotFound as exc:
            raise MoveError(
                f"RabbitMQ at {mask_password(self.url)} has no queue {queue!r}; "
                "pass existing names with --queues a,b (rabbitmqctl list_queues shows them)"
            ) from exc
        finally:
            if channel.is_open:
                channel.close()

    # -- dry run ----------------------------------------------------------------

    def count(self, result: MoveResult) -> None:
        """Fetch every message without acking it, count it, then hand them all back (requeue on close)."""
        for queue in self.queues:
            self.expected += self.depth(queue)
        channel = self.conn.channel()
        try:
            for queue in self.queues:
                n = 0
                while (message := channel.basic_get(queue=queue, no_ack=False)) is not None:
                    n += 1
                    result.bytes += len(message.body or b"")
                    if n % self.batch == 0:
                        result.moved[queue] = n
                        self._report(result)
                result.moved[queue] = n
        finally:
            # Closing the channel requeues every unacked message it fetched (amqp's basic_recover
            # does not wait for recover-ok, which then arrives during the close and is logged).
            channel.close()
        self._report(result)

    # -- move -------------------------------------------------------------------

    def run(self, result: MoveResult) -> None:
        for queue in self.queues:
            self.expected += self.depth(queue)
            if not self.store.queue_exists(name=queue):
                self.store.queue_declare(name=queue)  # never redeclare: a worker's arguments stay
            result.moved[queue] = 0
        channel = self.conn.channel()
        # Two batches in flight per queue: the next one streams in while this one is inserted.
        # Unacked deliveries return to RabbitMQ on a crash; only a committed, unacked batch repeats.
        channel.basic_qos(prefetch_size=0, prefetch_count=2 * self.batch, a_global=False)
        for queue in self.queues:
            channel.basic_consume(queue=queue, callback=self._collector(queue), no_ack=False)
        while True:
            try:
                self.conn.drain_events(timeout=self.idle)
                idle = False
            except TimeoutError:
                idle = True
            while len(self.pending) >= self.batch or (idle and self.pending):
                self._flush(channel, result)
            if idle and not any(self.depth(q) for q in self.queues):
                break

    def _collector(self, queue: str) -> Callable[[Any], None]:
        def collect(message: Any) -> None:
            self.pending.append((queue, message))

        return collect

    def _flush(self, channel: Any, result: MoveResult) -> None:
        chunk, self.pending = self.pending[: self.batch], self.pending[self.batch :]
        try:
            self.store.message_insert_many([to_new_message(q, m) for q, m in chunk])
        except AkadzeError as exc:
            raise MoveError(
                f"moving stopped after {result.total} message(s): {exc}; the failed batch of {len(chunk)} "
                "was not acked and goes back to RabbitMQ: fix the cause (look at the queue's next messages), rerun"
            ) from exc
        # Committed (autocommit). Only now ack: delivery tags grow in delivery order, so
        # multiple=True on the chunk's last tag acks exactly this chunk and what came before.
        channel.basic_ack(chunk[-1][1].delivery_tag, multiple=True)
        result.batches += 1
        for queue, message in chunk:
            result.moved[queue] += 1
            result.bytes += len(message.body or b"")
        self._report(result)
        self._throttle(result.total)

    def _throttle(self, moved: int) -> None:
        if self.max_rate is None:
            return
        ahead = moved / self.max_rate - (time.monotonic() - self.started)
        if ahead > 0:
            time.sleep(ahead)

    def _report(self, result: MoveResult) -> None:
        result.seconds = time.monotonic() - self.started
        if self.progress is not None:
            self.progress(Progress(result.total, self.expected, result.seconds, dict(result.moved)))


def move(
    source_url: str,
    store: Store,
    queues: Sequence[str],
    *,
    batch: int = DEFAULT_BATCH,
    dry_run: bool = False,
    idle: float = DEFAULT_IDLE,
    max_rate: float | None = None,
    connect_timeout: float = 10.0,
    progress: Callable[[Progress], None] | None = None,
) -> MoveResult:
    """Drain RabbitMQ *queues* into the akadze queues of the same names, a batch per INSERT.

    Each batch is acked on RabbitMQ only after its INSERT committed: a crash loses nothing and
    duplicates at most the batch in flight; rerunning resumes. ``dry_run`` counts and requeues.
    """
    mover = Mover(
        source_url,
        store,
        queues,
        batch=batch,
        idle=idle,
        max_rate=max_rate,
        connect_timeout=connect_timeout,
        progress=progress,
    )
    result = MoveResult(dry_run=dry_run, queues=mover.queues)
    mover.connect()
    mover.started = time.monotonic()
    try:
        if dry_run:
            mover.count(result)
        else:
            mover.run(result)
    except (OSError, amqp_exceptions.AMQPError) as exc:
        raise MoveError(
            f"RabbitMQ connection lost after moving {result.total} message(s): {exc}; "
            "everything moved is committed and acked (at most one batch may repeat): rerun to resume"
        ) from exc
    finally:
        mover.close()
    return result
