"""Store methods of the messages table: publish, claim, ack, release, requeue, bury, get."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from psycopg.types.json import Jsonb

from kombu_akadze.store import wire
from kombu_akadze.store.records import (
    EXHAUSTED,
    AckClaim,
    ClaimedMessage,
    NewMessage,
    Outcome,
    Tag,
    ack_claim_outcome,
    ack_claim_params,
    claimed_messages,
    requeue_outcome,
    split_tags,
)
from kombu_akadze.store.session import Session


class MessageQueries(Session):
    # -- messages -----------------------------------------------------------

    def message_insert(self, message: NewMessage, *, now: datetime | None = None) -> int | None:
        """The new row's id; None when the queue is full and rejects publishes (x-overflow)."""
        rows = self._run_direct("message_insert", {**self._message_params(message), "queue": message.queue, "now": now})
        return wire.integer(rows[0][0]) if rows[0][0] is not None else None

    def message_route(
        self, message: NewMessage, *, exchange: str, routing_key: str, now: datetime | None = None
    ) -> tuple[list[str], int]:
        """Publish through *exchange*: (queues that got a copy, queues that matched)."""
        params = {**self._message_params(message), "exchange": exchange, "routing_key": routing_key, "now": now}
        rows = self._run_direct("message_route", params)  # queue, id (NULL: full, took nothing)
        return [wire.string(r[0]) for r in rows if r[1] is not None], len(rows)

    def message_insert_many(self, messages: Sequence[NewMessage], *, now: datetime | None = None) -> int:
        if not messages:
            return 0
        self._run(
            "message_insert_many",
            {
                "queues": [m.queue for m in messages],
                "priorities": [m.priority for m in messages],
                "bodies": [m.body for m in messages],
                "content_types": [m.content_type for m in messages],
                "content_encodings": [m.content_encoding for m in messages],
                "headers": [Jsonb(m.headers or {}) for m in messages],
                "properties": [Jsonb(m.properties or {}) for m in messages],
                "delays": [float(m.delay) for m in messages],
                "ttls": [m.ttl for m in messages],
                "now": now,
            },
        )
        return len(messages)

    def message_route_many(
        self, batch: Sequence[tuple[str, str, NewMessage]], *, now: datetime | None = None
    ) -> tuple[int, int]:
        """Publish (exchange, routing_key, message) triples in one statement: (rows inserted, routed)."""
        if not batch:
            return 0, 0
        messages = [m for _, _, m in batch]
        rows = self._run(
            "message_route_many",
            {
                "exchanges": [e for e, _, _ in batch],
                "routing_keys": [k for _, k, _ in batch],
                "priorities": [m.priority for m in messages],
                "bodies": [m.body for m in messages],
                "content_types": [m.content_type for m in messages],
                "content_encodings": [m.content_encoding for m in messages],
                "headers": [Jsonb(m.headers or {}) for m in messages],
                "properties": [Jsonb(m.properties or {}) for m in messages],
                "ttls": [m.ttl for m in messages],
                "not_befores": [m.not_before for m in messages],
                "now": now,
            },
        )
        return int(rows[0]["inserted"]), int(rows[0]["routed"])

    def message_claim(
        self, *, queues: Sequence[str], limits: Sequence[int], owner: str, now: datetime | None = None
    ) -> list[ClaimedMessage]:
        rows = self._run(
            "message_claim",
            {"queues": list(queues), "limits": list(limits), "owner": owner, "now": now},
        )
        return claimed_messages(rows)

    def message_ack_claim(
        self,
        *,
        acks: Iterable[Tag],
        queues: Sequence[str],
        limits: Sequence[int],
        owner: str,
        now: datetime | None = None,
        park: str | None = None,
    ) -> AckClaim:
        """Write finished runs and claim the next messages in one statement; with *park* (the consumer's
        wake-up channel) it also parks on the queues the claim came back short for (function ack_claim)."""
        params = ack_claim_params(acks, queues, limits, owner, now, durable=self.durable_acks, park=park)
        rows = self._run("message_ack_claim", params)
        return ack_claim_outcome(rows)

    # Every outcome is fenced on (id, run_count) and on the owner, the consumer that claimed the run.

    def message_ack(self, tags: Iterable[Tag], *, owner: str) -> set[int]:
        return self._ids("message_ack", tags, owner=owner, durable=self.durable_acks)

    def message_release(self, tags: Iterable[Tag], *, owner: str) -> set[int]:
        return self._ids("message_release", tags, owner=owner)

    def message_refuse(self, tags: Iterable[Tag], *, owner: str) -> set[int]:
        """Give back handed-over messages never delivered: as message_release, the handed run undone too."""
        return self._ids("message_refuse", tags, owner=owner)

    def message_bury(self, tags: Iterable[Tag], *, reason: str, owner: str) -> set[int]:
        return self._ids("message_bury", tags, reason=reason, owner=owner)

    def message_requeue(self, tags: Iterable[Tag], *, max_attempts: int, owner: str) -> Outcome:
        ids, run_counts = split_tags(tags)
        if not ids:
            return Outcome(frozenset(), frozenset())
        rows = self._run(
            "message_requeue",
            {
                "ids": ids,
                "run_counts": run_counts,
                "owner": owner,
                "max_attempts": max_attempts,
                "exhausted_reason": EXHAUSTED,
            },
        )
        return requeue_outcome(rows)

    def _ids(self, name: str, tags: Iterable[Tag], **extra: Any) -> set[int]:
        ids, run_counts = split_tags(tags)
        if not ids:
            return set()
        rows = self._run(name, {"ids": ids, "run_counts": run_counts, **extra})
        return {int(r["id"]) for r in rows}

    def message_get(self, message_id: int) -> dict[str, Any] | None:
        rows = self._run("message_get", {"id": message_id})
        return rows[0] if rows else None

    def message_counts(self) -> dict[tuple[str, str], int]:
        return {(r["queue"], r["state"]): int(r["n"]) for r in self._run("message_counts")}

    def deadletter_list(self, *, queue: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        return self._run("deadletter_list", {"queue": queue, "limit": limit})
