"""Rescue: messages held by dead consumers go back to ready (an attempt spent) or to dead letters."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from kombu_akadze.store import Store

logger = logging.getLogger("kombu_akadze")

#: Seconds between rescue passes of one live consumer.
DEFAULT_INTERVAL = 5.0


@dataclass(frozen=True)
class RescueResult:
    requeued: int
    dead: int
    consumers_gone: int


def run_once(store: Store, *, ttl: float, max_attempts: int, now: datetime | None = None) -> RescueResult:
    """One pass over every queue of the schema; safe to run from many consumers at once."""
    outcome = store.lease_rescue(ttl=ttl, max_attempts=max_attempts, now=now)
    result = RescueResult(len(outcome.ready), len(outcome.dead), outcome.consumers_gone)
    _log_rescue(result.consumers_gone, result.requeued, result.dead, ttl=ttl)
    return result


def _log_rescue(consumers_gone: int, requeued: int, dead: int, *, ttl: float) -> None:
    """A warning when messages moved; only INFO when the silent consumers held nothing (a `celery inspect`
    or other short-lived client that exited without closing its connection: nothing to worry about)."""
    if not (requeued or dead or consumers_gone):
        return
    logger.log(
        logging.WARNING if requeued or dead else logging.INFO,
        "kombu-akadze rescue: %d consumer(s) missed their heartbeat for %.0f s; "
        "%d message(s) back to ready, %d to dead letters (max_attempts exceeded)",
        consumers_gone,
        ttl,
        requeued,
        dead,
    )


def expire_once(store: Store, *, ttl: float, now: datetime | None = None) -> dict[str, int]:
    """Queue expiry (x-expires, abandoned auto_delete/exclusive queues) and message TTL, once."""
    counts = store.queue_expire(ttl=ttl, now=now)
    if counts["queues"] or counts["expired"]:
        logger.info(
            "kombu-akadze expiry: %d unused queue(s) deleted (%d message(s) with them), "
            "%d message(s) past their TTL (%d into dead letters)",
            counts["queues"],
            counts["dropped"],
            counts["expired"],
            counts["buried"],
        )
    return counts


def report(counts: dict[str, int], *, ttl: float) -> None:
    """Log what one maintenance pass (consumer_maintain) changed, if anything."""
    _log_rescue(counts["consumers_gone"], counts["requeued"], counts["dead"], ttl=ttl)
    if counts.get("unstranded"):
        logger.warning(
            "kombu-akadze reconcile: %d message(s) held under this consumer's id for over %.0f s that it "
            "never received (the reply of a claim that committed was lost) back to ready, attempt given back",
            counts["unstranded"],
            ttl,
        )
    if counts["queues"] or counts["expired"]:
        logger.info(
            "kombu-akadze expiry: %d unused queue(s) deleted (%d message(s) with them), "
            "%d message(s) past their TTL (%d into dead letters)",
            counts["queues"],
            counts["dropped"],
            counts["expired"],
            counts["buried"],
        )
