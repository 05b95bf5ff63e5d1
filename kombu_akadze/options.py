"""Every transport option: name, type, default, unit, meaning and validation, in one place."""

from __future__ import annotations

import difflib
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from kombu_akadze.errors import ConfigurationError

logger = logging.getLogger("kombu_akadze")

# Options kombu, Celery or other transports put in transport_options; accepted and ignored here.
FOREIGN_OPTIONS = frozenset(
    {
        "body_encoding",
        "deadletter_queue",
        "confirm_publish",
        "max_retries",
        "interval_start",
        "interval_step",
        "interval_max",
        "visibility_timeout",
        "global_keyprefix",
        "socket_timeout",
        "socket_connect_timeout",
        "client_properties",
    }
)


#: Unknown option names already warned about: a Celery worker builds a transport for each of its
#: connections (consumer, remote control, gossip, events, producer pool), one warning is enough.
_WARNED_UNKNOWN: set[str] = set()
_WARNED_LOCK = threading.Lock()


def warn_unknown(unknown: list[str], known: set[str]) -> None:
    """Warn once per process about each unknown option name, with the closest valid name if one is close."""
    with _WARNED_LOCK:
        fresh = [name for name in unknown if name not in _WARNED_UNKNOWN]
        _WARNED_UNKNOWN.update(fresh)
    for name in fresh:
        close = difflib.get_close_matches(name, sorted(known | FOREIGN_OPTIONS), n=1, cutoff=0.75)
        hint = f"did you mean {close[0]!r}? " if close else ""
        logger.warning(
            "kombu-akadze ignores unknown transport option %r: %svalid options: %s",
            name,
            hint,
            ", ".join(sorted(known)),
        )


@dataclass(frozen=True)
class Options:
    """Validated transport options (``broker_transport_options`` in Celery)."""

    #: PostgreSQL schema that holds the tables (created by the migrations).
    schema: str = "akadze"
    #: Apply pending migrations on first connect; off: a pending schema is an error.
    auto_migrate: bool = True
    #: Seconds between heartbeats of a consuming connection.
    heartbeat_interval: float = 5.0
    #: Seconds without a heartbeat after which a consumer is dead and its messages are rescued.
    heartbeat_ttl: float = 30.0
    #: Seconds between rescue passes run by each live consumer.
    rescue_interval: float = 5.0
    #: Runs a message may start before it goes to dead letters (per queue: ``queue_max_attempts``).
    max_attempts: int = 20
    #: Per-queue override of ``max_attempts``: {"queue name": attempts}.
    queue_max_attempts: Mapping[str, int] | None = None
    #: Seconds of the safety poll (jittered between half and all of it); LISTEN wakes consumers sooner.
    poll_interval: float = 1.0
    #: Seconds between each consumer's compaction checks: when a drained backlog left the
    #: messages indexes bloated over a small heap, REINDEX gives the space back (0: never).
    compact_interval: float = 300.0
    #: Use LISTEN/NOTIFY wake-ups; behind PgBouncer's transaction pooling only with listen_url.
    listen: bool = True
    #: Where the heartbeat session (which also LISTENs) connects, when not to the broker URL (same forms, checked by the
    #: transport with urls.listen_dsn): PostgreSQL itself while every other session goes through
    #: PgBouncer. Kept out of repr (it may hold a password).
    listen_url: str = field(default="", repr=False)
    #: Share one LISTEN session among the consumers of a host (Linux): PostgreSQL spends a
    #: transaction in every LISTENing session at each NOTIFY, so N consumers each listening
    #: would cost N per wake-up. Off: every consumer LISTENs on its own heartbeat session.
    listen_relay: bool = True
    #: Seconds of the safety poll while LISTEN is armed (every write notifies; this only bounds
    #: the delay of a row written without a NOTIFY, e.g. by hand).
    listen_poll_interval: float = 10.0
    #: Seconds a publisher remembers that Celery's event exchange has no bound queue (no monitor
    #: running), so idle workers' heartbeat events cost no round trip; a monitor that starts
    #: sees events from every worker within this long.
    event_route_cache: float = 10.0
    #: Most messages one claim takes when the channel has no prefetch limit.
    claim_batch: int = 100
    #: Seconds to wait for a new database connection.
    connect_timeout: float = 10.0
    #: Seconds: a Celery ETA further ahead than this is kept in the database (no lease, no worker
    #: memory) until this long before it is due; 0 turns native delay off.
    native_delay_threshold: float = 60.0
    #: Largest message body accepted at publish, in bytes (0: no limit).
    max_message_size: int = 0
    #: Let psycopg prepare statements it runs often (server-side); off for PgBouncer in
    #: transaction pooling mode before 1.21, where a prepared statement may be on another server.
    prepared_statements: bool = True
    #: Acks and claims wait for the WAL flush (and synchronous standbys) before they return, as
    #: publishes always do. Off, they commit asynchronously: a crash of the server may undo the
    #: acks and claims of its last ~0.6 s (3 x wal_writer_delay), so those messages run again;
    #: none is lost, since a publish, release, requeue or reject is always durable.
    durable_acks: bool = False
    #: Seconds an ack may wait for others to ride in the same statement, on Celery's event loop while
    #: the worker holds a task waiting for a pool process and still more than half its prefetch window
    #: (a prefetch multiplier above 1): one statement then writes several acks and claims for their
    #: slots together. It never delays the refill of an idle pool process (0: every tick's acks go at once).
    ack_batch_delay: float = 0.002
    #: Messages published transient (delivery_mode=1: Celery's task_default_delivery_mode="transient",
    #: its events and remote-control messages) commit without waiting for the WAL flush: a crash of
    #: the server may lose those of its last ~0.6 s (3 x wal_writer_delay), as RabbitMQ loses transient
    #: messages at a restart. Off: every publish is durable, whatever its delivery mode.
    transient_async: bool = False
    #: Seconds any statement of the transport's sessions may wait for a lock (0: no limit). A claim
    #: behind a lock held elsewhere (a long REINDEX, an operator's LOCK TABLE) then fails with a
    #: transient error, retried as a lost connection, instead of freezing the consumer (remote
    #: control included): Celery's event loop waits inline for an idle worker's claim.
    lock_timeout: float = 5.0
    #: Seconds any statement of the transport's sessions may run (0: no limit); the consumer's own
    #: VACUUM fallback runs without it. A backstop far above any normal statement (milliseconds).
    statement_timeout: float = 300.0
    #: Seconds after which the session of a connection that only publishes (no consumer, nothing
    #: held) is closed if unused; its next publish reconnects (0: never). A pool child or a web
    #: process that published once does not hold a PostgreSQL backend for the rest of its life.
    idle_close: float = 30.0

    @classmethod
    def from_transport_options(cls, raw: Mapping[str, Any] | None) -> Options:
        raw = dict(raw or {})
        if "polling_interval" in raw and "poll_interval" not in raw:
            raw["poll_interval"] = raw.pop("polling_interval")
        raw.pop("polling_interval", None)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known - FOREIGN_OPTIONS)
        if unknown:
            warn_unknown(unknown, known)
        values = {name: raw[name] for name in known if name in raw}
        opts = cls(**{name: _coerce(name, value) for name, value in values.items()})
        opts.validate()
        return opts

    def validate(self) -> None:
        if not isinstance(self.schema, str) or not 0 < len(self.schema) <= 48 or "\x00" in self.schema:
            raise ConfigurationError(
                f"transport option schema={self.schema!r} is not valid: use a name of 1 to 48 characters"
            )
        for name in (
            "heartbeat_interval",
            "heartbeat_ttl",
            "rescue_interval",
            "poll_interval",
            "listen_poll_interval",
            "connect_timeout",
        ):
            if getattr(self, name) <= 0:
                raise ConfigurationError(f"transport option {name} must be a number of seconds > 0")
        if self.heartbeat_ttl < 2 * self.heartbeat_interval:
            raise ConfigurationError(
                f"heartbeat_ttl ({self.heartbeat_ttl} s) must be at least twice heartbeat_interval "
                f"({self.heartbeat_interval} s), or one late heartbeat would look like a dead worker"
            )
        self._validate_timeouts()
        if self.native_delay_threshold < 0:
            raise ConfigurationError("transport option native_delay_threshold must be >= 0 seconds (0: off)")
        if self.compact_interval < 0:
            raise ConfigurationError("transport option compact_interval must be >= 0 seconds (0: off)")
        if self.event_route_cache < 0:
            raise ConfigurationError("transport option event_route_cache must be >= 0 seconds (0: no cache)")
        if self.max_attempts < 1:
            raise ConfigurationError("transport option max_attempts must be an integer >= 1")
        for queue, attempts in (self.queue_max_attempts or {}).items():
            if not isinstance(attempts, int) or attempts < 1:
                raise ConfigurationError(f"queue_max_attempts[{queue!r}] must be an integer >= 1, not {attempts!r}")
        if self.claim_batch < 1:
            raise ConfigurationError("transport option claim_batch must be an integer >= 1")
        if self.max_message_size < 0:
            raise ConfigurationError("transport option max_message_size must be >= 0 bytes (0: no limit)")

    def _validate_timeouts(self) -> None:
        for name in ("lock_timeout", "statement_timeout"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"transport option {name} must be >= 0 seconds (0: no limit)")
        if self.statement_timeout and self.lock_timeout > self.statement_timeout:
            raise ConfigurationError(
                f"lock_timeout ({self.lock_timeout} s) must not exceed statement_timeout ({self.statement_timeout} s): "
                "a statement is cancelled at statement_timeout whatever it waits for"
            )
        if self.idle_close < 0:
            raise ConfigurationError("transport option idle_close must be >= 0 seconds (0: never)")
        if not 0 <= self.ack_batch_delay <= 1:
            raise ConfigurationError("transport option ack_batch_delay must be between 0 and 1 second (0: off)")

    def max_attempts_for(self, queue: str) -> int | None:
        """The configured per-queue max_attempts, if any."""
        return (self.queue_max_attempts or {}).get(queue)


_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def _to_bool(value: Any) -> bool:
    if isinstance(value, str):
        return _BOOL_WORDS[value.strip().lower()]
    if isinstance(value, bool | int):
        return bool(value)
    raise TypeError(value)


def _to_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise TypeError(value)
    return int(value)


def _to_float(value: Any) -> float:
    if isinstance(value, bool):
        raise TypeError(value)
    return float(value)


def _to_mapping(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(value)
    return {str(k): v for k, v in value.items()}


def _coerce(name: str, value: Any) -> Any:
    default = Options.__dataclass_fields__[name].default
    converters: dict[type, Any] = {bool: _to_bool, int: _to_int, float: _to_float, str: str}
    convert = converters.get(type(default), _to_mapping)
    try:
        return convert(value)
    except (TypeError, ValueError, KeyError):
        kind = type(default).__name__ if default is not None else "mapping"
        raise ConfigurationError(
            f"transport option {name}={value!r} is not valid: expected {kind} (default {default!r})"
        ) from None
