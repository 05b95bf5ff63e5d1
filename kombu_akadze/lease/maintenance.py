"""The fleet's maintenance passes, run by the elected consumer: each pass one store method, a round one commit."""

from __future__ import annotations

import logging
from datetime import datetime

from kombu_akadze.store import Store

logger = logging.getLogger("kombu_akadze")


def run_once(
    store: Store, *, ttl: float, max_attempts: int, consumer_id: str | None = None, now: datetime | None = None
) -> dict[str, int]:
    """Every pass once, in one transaction: forget where silent consumers were parked, rescue the leases
    of consumers silent for *ttl* s (never *consumer_id*'s own), promote due delayed messages, expire
    messages past their TTL, route dead letters to their queue's DLX, drop heads beyond x-max-length,
    delete expired queues. Safe to run from two consumers at once (a hand-over): the passes skip rows
    another one holds. Counts by kind."""
    with store.transaction():
        unparked = store.waiting_prune(ttl=ttl, now=now)
        rescued = store.lease_rescue(ttl=ttl, max_attempts=max_attempts, consumer_id=consumer_id, now=now)
        counts = {"requeued": len(rescued.ready), "dead": len(rescued.dead), "consumers_gone": rescued.consumers_gone}
        counts["unparked"] = unparked
        counts["promoted"] = store.message_promote(now=now)
        counts.update(store.message_expire(now=now))
        counts["dead_lettered"] = store.deadletter_route(now=now)
        counts["capped"] = store.queue_cap()
        counts.update(store.queue_expire(ttl=ttl, now=now))
        counts["unvacuumed"] = store.messages_unvacuumed()
    report(counts, ttl=ttl)
    return counts


def report(counts: dict[str, int], *, ttl: float) -> None:
    """Log what one round changed: a warning when messages moved off dead consumers; only INFO when the
    silent consumers held nothing (a `celery inspect` or other short-lived client that exited without
    closing its connection: nothing to worry about), and for expiry."""
    requeued, dead, gone = counts.get("requeued", 0), counts.get("dead", 0), counts.get("consumers_gone", 0)
    if requeued or dead or gone:
        logger.log(
            logging.WARNING if requeued or dead else logging.INFO,
            "kombu-akadze rescue: %d consumer(s) missed their heartbeat for %.0f s; "
            "%d message(s) back to ready, %d to dead letters (max_attempts exceeded)",
            gone,
            ttl,
            requeued,
            dead,
        )
    if counts.get("queues") or counts.get("expired") or counts.get("capped"):
        logger.info(
            "kombu-akadze expiry: %d unused queue(s) deleted (%d message(s) with them), "
            "%d message(s) past their TTL (%d into dead letters), %d dropped from the head of capped queues",
            counts.get("queues", 0),
            counts.get("dropped", 0),
            counts.get("expired", 0),
            counts.get("buried", 0),
            counts.get("capped", 0),
        )


def report_unstranded(count: int, *, ttl: float) -> None:
    if count:
        logger.warning(
            "kombu-akadze reconcile: %d message(s) held under this consumer's id for over %.0f s that it "
            "never received (the reply of a claim that committed, or the notification of a handoff, was lost) back to "
            "ready, attempt given back",
            count,
            ttl,
        )
