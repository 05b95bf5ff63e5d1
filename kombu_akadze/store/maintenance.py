"""Store methods of liveness and maintenance: the heartbeat, and each pass the elected consumer runs."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

from kombu_akadze.store.records import EXHAUSTED, Beat, ClaimedMessage, Outcome, claimed_messages, requeue_outcome
from kombu_akadze.store.session import Session


class MaintenanceQueries(Session):
    def consumer_heartbeat(
        self,
        *,
        consumer_id: str,
        hostname: str,
        pid: int,
        queues: Sequence[str] = (),
        ttl: float = 30.0,
        now: datetime | None = None,
    ) -> Beat:
        """Mark the consumer alive: whether it is the elected one (oldest alive within *ttl*), and which of
        its queues have a message claimable now."""
        rows = self._run(
            "consumer_heartbeat",
            {"id": consumer_id, "hostname": hostname, "pid": pid, "queues": list(queues), "ttl": float(ttl)}
            | {"now": now},
        )
        return Beat(leader=bool(rows[0]["leader"]), ready=tuple(rows[0]["ready"] or ()))

    def consumer_unpark(self, *, consumer_id: str, queues: list[str] | None = None) -> None:
        """No longer parked on *queues* (None: anywhere, before consumer_delete): no publish to them hands
        this consumer a message."""
        self._run("consumer_unpark", {"id": consumer_id, "queues": queues}, fetch=False)

    def consumer_delete(self, *, consumer_id: str) -> int:
        """Forget the consumer; what is still held under its id goes back to ready (see the query). How
        many messages went back."""
        return int(self._run("consumer_delete", {"id": consumer_id})[0]["released"])

    def consumer_delete_idle(self, *, consumer_id: str) -> bool:
        """Forget the consumer unless a message is held under its id; whether it went."""
        return bool(self._run("consumer_delete_idle", {"id": consumer_id})[0]["forgotten"])

    def lease_rescue(
        self, *, ttl: float, max_attempts: int, consumer_id: str | None = None, now: datetime | None = None
    ) -> Outcome:
        rows = self._run(
            "lease_rescue",
            {
                "id": consumer_id,
                "ttl": float(ttl),
                "max_attempts": max_attempts,
                "exhausted_reason": EXHAUSTED,
                "now": now,
            },
        )
        return requeue_outcome(rows)

    def waiting_prune(self, *, ttl: float, now: datetime | None = None) -> int:
        """Forget where consumers silent for *ttl* s were parked; how many rows went."""
        return int(self._run("waiting_prune", {"ttl": float(ttl), "now": now})[0]["unparked"])

    def lease_orphans(
        self, *, consumer_id: str, tracked: Collection[int], ttl: float, now: datetime | None = None
    ) -> dict[int, int]:
        """Rows held under *consumer_id* for over *ttl* s that are not in *tracked*: id -> run_count."""
        rows = self._run(
            "lease_orphans", {"id": consumer_id, "tracked": sorted(tracked), "ttl": float(ttl), "now": now}
        )
        return {int(r["id"]): int(r["run_count"]) for r in rows}

    def lease_unseen(self, *, consumer_id: str, tracked: Collection[int]) -> list[ClaimedMessage]:
        """Every row held under *consumer_id* that is not in *tracked*, as messages (see adoption)."""
        return claimed_messages(self._run("lease_unseen", {"id": consumer_id, "tracked": sorted(tracked)}))

    def message_promote(self, *, now: datetime | None = None) -> int:
        return int(self._run("message_promote", {"now": now})[0]["promoted"])

    def deadletter_route(self, *, now: datetime | None = None) -> int:
        return int(self._run("deadletter_route", {"now": now})[0]["dead_lettered"])

    def queue_cap(self) -> int:
        return int(self._run("queue_cap")[0]["capped"])

    def queue_expire(self, *, ttl: float, now: datetime | None = None) -> dict[str, int]:
        """Queues unused past x-expires, abandoned auto_delete/exclusive queues: counts of what went."""
        rows = self._run("queue_expire", {"ttl": float(ttl), "now": now})
        return {k: int(v) for k, v in rows[0].items()}

    def message_expire(self, *, now: datetime | None = None) -> dict[str, int]:
        """Message TTL: counts of expired messages and of those buried (their queue names a DLX)."""
        rows = self._run("message_expire", {"now": now})
        return {k: int(v) for k, v in rows[0].items()}

    def messages_unvacuumed(self) -> int:
        return int(self._run("messages_unvacuumed", {"schema": self.schema})[0]["unvacuumed"])
