"""What the store's methods take and return: plain dataclasses, and the rows they are made from."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

#: A claimed run of a message: the row id and the run_count it was claimed with.
Tag = tuple[int, int]


@dataclass(frozen=True)
class ClaimedMessage:
    id: int
    queue: str
    priority: int
    body: bytes
    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any]
    properties: dict[str, Any]
    run_count: int
    attempts: int

    @property
    def tag(self) -> Tag:
        return (self.id, self.run_count)


@dataclass(frozen=True)
class Outcome:
    """What a requeue or rescue did: ids back to ready, ids sent to dead letters."""

    ready: frozenset[int]
    dead: frozenset[int]
    consumers_gone: int = 0


#: The reason a rescued or requeued message whose attempts are used up carries into dead letters.
EXHAUSTED = "max_attempts exceeded"


@dataclass(frozen=True)
class NewMessage:
    queue: str
    body: bytes
    priority: int = 0
    content_type: str | None = None
    content_encoding: str | None = None
    headers: dict[str, Any] | None = None
    properties: dict[str, Any] | None = None
    delay: float = 0.0
    #: Seconds until the message expires if still ready (RabbitMQ's per-message expiration).
    ttl: float | None = None
    #: Not claimable before this time (a far Celery ETA, minus the native-delay lead).
    not_before: datetime | None = None
    #: Its publish waits for the WAL flush (and synchronous standbys). False only for a transient
    #: message (delivery_mode=1) under the transport option transient_async.
    durable: bool = True


def split_tags(tags: Iterable[Tag]) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    run_counts: list[int] = []
    for message_id, run_count in tags:
        ids.append(int(message_id))
        run_counts.append(int(run_count))
    return ids, run_counts


def ack_claim_params(
    acks: Iterable[Tag],
    queues: Sequence[str],
    limits: Sequence[int],
    owner: str,
    now: datetime | None,
    *,
    durable: bool,
    park: str | None = None,
) -> dict[str, Any]:
    """The parameters of message_ack_claim, for the blocking and the event-loop paths alike."""
    ack_ids, ack_run_counts = split_tags(acks)
    return {"ack_ids": ack_ids, "ack_run_counts": ack_run_counts, "queues": list(queues),
            "limits": list(limits), "owner": owner, "now": now, "durable": durable, "park": park}  # fmt: skip


class Beat(NamedTuple):
    """What one consumer_heartbeat said."""

    #: This consumer is the elected one: it runs the fleet's maintenance passes.
    leader: bool
    #: Its consumed queues with a message claimable now (claim, if a slot is free).
    ready: tuple[str, ...] = ()


class AckClaim(NamedTuple):
    """What one message_ack_claim did."""

    claimed: list[ClaimedMessage]
    acked: set[int]
    #: Queues the claim came back short for and could not park on (a publish to them was committing
    #: at that moment): claim again at once, do not wait for a wake-up.
    retry: frozenset[str] = frozenset()


def ack_claim_outcome(rows: list[dict[str, Any]]) -> AckClaim:
    """message_ack_claim's rows: claimed messages, acked ids, queues to claim again at once."""
    acked = {int(r["id"]) for r in rows if r["kind"] == "acked"}
    retry = frozenset(r["queue"] for r in rows if r["kind"] == "retry")
    return AckClaim(claimed_messages([r for r in rows if r["kind"] == "claimed"]), acked, retry)


def claimed_messages(rows: list[dict[str, Any]]) -> list[ClaimedMessage]:
    """Claimed rows as messages, in claim order (priority first, then publish order)."""
    claimed = [
        ClaimedMessage(
            id=r["id"],
            queue=r["queue"],
            priority=r["priority"],
            body=bytes(r["body"]),
            content_type=r["content_type"],
            content_encoding=r["content_encoding"],
            headers=r["headers"],
            properties=r["properties"],
            run_count=r["run_count"],
            attempts=r["attempts"],
        )
        for r in rows
    ]
    claimed.sort(key=lambda m: (-m.priority, m.id))
    return claimed


#: How a notification that hands a message over begins (function handoff_payload, migration 0018); any
#: other payload is a wake-up naming a queue.
HANDOFF_MARK = '{"akadze_handoff"'


def is_handoff(payload: str) -> bool:
    return payload.startswith(HANDOFF_MARK)


class Handoff(NamedTuple):
    """What a handoff notification says."""

    #: The message, held already by the consumer it was sent to.
    message: ClaimedMessage
    #: That consumer is still parked on the queue (slots left); False: it parks again at its next claim.
    parked: bool


def handoff_message(payload: str) -> ClaimedMessage:
    """The message a handoff notification carries (see read_handoff)."""
    return read_handoff(payload).message


def read_handoff(payload: str) -> Handoff:
    """A handoff notification's message and whether its consumer is still parked. Raises ValueError for
    a payload that is not one (is_handoff tells them apart first)."""
    try:
        d = json.loads(payload)
        message = ClaimedMessage(
            id=int(d["id"]),
            queue=str(d["queue"]),
            priority=int(d["priority"]),
            body=base64.b64decode(d["body"]),
            content_type=d["content_type"],
            content_encoding=d["content_encoding"],
            headers=d["headers"],
            properties=d["properties"],
            run_count=int(d["run_count"]),
            attempts=int(d["attempts"]),
        )
        return Handoff(message, d["parked"] is True)
    except (KeyError, TypeError, binascii.Error) as exc:
        raise ValueError(f"not a handoff notification: {exc}") from exc


def requeue_outcome(rows: list[dict[str, Any]]) -> Outcome:
    ready = frozenset(int(r["id"]) for r in rows if r["outcome"] == "ready")
    dead = frozenset(int(r["id"]) for r in rows if r["outcome"] == "dead")
    gone = sum(1 for r in rows if r["outcome"] == "consumer_gone")
    return Outcome(ready, dead, gone)


# -- operations records --


@dataclass(frozen=True)
class TableSize:
    heap_bytes: int
    index_bytes: int


@dataclass(frozen=True)
class QueueStats:
    """One queue's depth: ready now, held by consumers, delayed (ready later), dead letters."""

    queue: str
    ready: int
    held: int
    delayed: int
    dead: int
    #: Seconds the oldest ready message has been claimable (None: nothing ready).
    oldest_ready_age_seconds: float | None
    #: Live consumers of the whole schema (the consumers table does not record queues).
    consumers_alive: int
    #: Messages running or waiting again after a run that ended without an outcome (a rescued
    #: lease, a requeue): attempts > 0.
    retried: int = 0


@dataclass(frozen=True)
class StatsSnapshot:
    taken_at: datetime
    consumers_alive: int
    queues: tuple[QueueStats, ...]


@dataclass(frozen=True)
class FleetStats:
    """Counters PostgreSQL keeps anyway (cumulative since its last statistics reset) and the leader."""

    #: Rows inserted into messages: published, replayed from dead letters.
    messages_inserted: int
    #: Rows deleted from messages: acked, dead-lettered, expired, purged, capped.
    messages_deleted: int
    #: Rows inserted into dead_letters.
    dead_lettered: int
    #: The consumer that runs the fleet's maintenance passes (None: no live consumer).
    leader_id: str | None
    leader_hostname: str | None
    leader_pid: int | None


@dataclass(frozen=True)
class DeadLetterFilter:
    """Which dead letters a find, count, replay or purge touches; None means any."""

    ids: tuple[int, ...] | None = None
    queue: str | None = None
    task: str | None = None
    reason: str | None = None
    #: Seconds: only dead letters buried longer ago than this.
    older_than: float | None = None

    @property
    def is_empty(self) -> bool:
        return all(v is None for v in (self.ids, self.queue, self.task, self.reason, self.older_than))

    def params(self) -> dict[str, Any]:
        return {
            "ids": None if self.ids is None else [int(i) for i in self.ids],
            "queue": self.queue,
            "task": self.task,
            "reason": self.reason,
            "older_than": None if self.older_than is None else float(self.older_than),
        }


@dataclass(frozen=True)
class DeadLetterSummary:
    id: int
    queue: str
    task: str | None
    reason: str
    run_count: int
    attempts: int
    last_owner: str | None
    created_at: datetime
    dead_at: datetime
    body_size: int


@dataclass(frozen=True)
class DeadLetter:
    id: int
    queue: str
    priority: int
    body: bytes
    content_type: str | None
    content_encoding: str | None
    headers: dict[str, Any]
    properties: dict[str, Any]
    run_count: int
    attempts: int
    reason: str
    last_owner: str | None
    created_at: datetime
    dead_at: datetime


@dataclass(frozen=True)
class ReplayResult:
    """Ids put back as ready, and ids whose dead letter was dropped because the message is already live."""

    replayed: frozenset[int]
    already_live: frozenset[int]
