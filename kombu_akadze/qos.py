"""QoS: delivery tags are (row id, run_count); ack, reject and restore are fenced statements on the same row."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from kombu.transport import virtual

from kombu_akadze.errors import AkadzeError, TransientDatabaseError
from kombu_akadze.store import Tag

if TYPE_CHECKING:
    from kombu_akadze.transport import Channel

logger = logging.getLogger("kombu_akadze")

REJECT_REASON = "rejected by consumer (requeue=False)"


def make_tag(message_id: int, run_count: int) -> str:
    return f"{message_id}:{run_count}"


def parse_tag(delivery_tag: Any) -> Tag:
    """'id:run_count' back to its parts; anything else is a programming error, said loudly."""
    try:
        message_id, run_count = str(delivery_tag).split(":")
        return int(message_id), int(run_count)
    except ValueError:
        raise ValueError(
            f"{delivery_tag!r} is not a kombu-akadze delivery tag (expected 'message_id:run_count')"
        ) from None


class QoS(virtual.QoS):
    """Prefetch accounting from kombu; outcomes written to the row the tag names, never a copy."""

    channel: Channel

    def __init__(self, channel: Channel, prefetch_count: int = 0) -> None:
        super().__init__(channel, prefetch_count)
        self._retry_lock = threading.Lock()
        # Outcomes whose statement failed transiently: retried while the lease is ours.
        self._retry: list[tuple[str, str]] = []

    def ack(self, delivery_tag: str) -> None:
        self._settle("ack", delivery_tag)

    def reject(self, delivery_tag: str, requeue: bool = False) -> None:
        self._settle("requeue" if requeue else "bury", delivery_tag)

    def _settle(self, kind: str, delivery_tag: str, *, retrying: bool = False) -> bool:
        tag = parse_tag(delivery_tag)
        store = self.channel.store
        try:
            if kind == "ack":
                done = store.message_ack([tag])
            elif kind == "bury":
                done = store.message_bury([tag], reason=REJECT_REASON)
            else:
                outcome = store.message_requeue([tag], max_attempts=self.channel.max_attempts_default)
                done = set(outcome.ready | outcome.dead)
                if outcome.dead:
                    logger.warning("kombu-akadze: message id=%s used up its attempts; moved to dead letters", tag[0])
        except TransientDatabaseError as exc:
            logger.error(
                "kombu-akadze: %s of message id=%s run_count=%s failed (%s); the message stays held "
                "and the %s is retried while its lease is ours",
                kind,
                tag[0],
                tag[1],
                exc,
                kind,
            )
            with self._retry_lock:
                self._retry.append((kind, delivery_tag))
            return False
        if tag[0] not in done:
            log = logger.info if retrying else logger.warning
            log(
                "kombu-akadze: %s of message id=%s run_count=%s changed nothing: that run is not ours any "
                "more (its lease was rescued after a missed heartbeat, or the message is gone); the "
                "newer run stands",
                kind,
                tag[0],
                tag[1],
            )
            self.channel.connection.fenced_outcomes += 1
        self._quick_ack(delivery_tag)
        return True

    def retry_pending(self) -> int:
        """Write again the outcomes that failed transiently; returns how many are still pending."""
        with self._retry_lock:
            pending, self._retry = self._retry, []
        for kind, delivery_tag in pending:
            self._settle(kind, delivery_tag, retrying=True)
        with self._retry_lock:
            return len(self._retry)

    def restore_unacked(self) -> list[tuple[BaseException, Any]]:
        """Give back every held, unsettled message in place, attempt not spent (one statement)."""
        self.retry_pending()
        self._flush()
        delivered = self._delivered
        tags = [parse_tag(dtag) for dtag in list(delivered) if dtag not in self._dirty]
        delivered.clear()
        if not tags:
            return []
        try:
            released = self.channel.store.message_release(tags)
        except AkadzeError as exc:
            logger.error(
                "kombu-akadze: could not release %d held message(s) (%s); they stay held and are "
                "rescued once this consumer's heartbeat is older than heartbeat_ttl",
                len(tags),
                exc,
            )
            return []
        stale = len(tags) - len(released)
        logger.info("kombu-akadze: released %d held message(s) in place", len(released))
        if stale:
            logger.info("kombu-akadze: %d held message(s) were no longer ours at release", stale)
        return []
