"""Many publishes, one statement: buffer a channel's publishes and write them as one multi-row INSERT."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger("kombu_akadze")


def _channel_of(target: Any) -> Any:
    """A kombu-akadze channel from a Producer, a Connection or a channel."""
    channel = getattr(target, "channel", None) or getattr(target, "default_channel", None) or target
    if not hasattr(channel, "_batch"):
        raise TypeError(
            f"{type(target).__name__} is not a kombu-akadze producer, connection or channel; "
            "batched publishing needs broker_url akadze+postgresql://..."
        )
    return channel


@contextmanager
def publishing(target: Any) -> Iterator[None]:
    """Within the block, publishes on *target* are buffered; at its end they are written in ONE
    statement (one round trip, one commit), or not at all if the block raises.

    For a Celery fan-out::

        with app.producer_or_acquire() as producer, kombu_akadze.integrations.batch.publishing(producer):
            group(task.s(i) for i in range(1000)).apply_async(producer=producer)

    Queue caps (x-max-length with reject-publish) are not checked for batched messages.
    """
    channel = _channel_of(target)
    if channel._batch is not None:
        yield  # nested: the outer block writes everything
        return
    channel._batch = []
    try:
        yield
        batch = channel._batch
    finally:
        channel._batch = None  # on an exception nothing buffered is written
    if batch:
        _, routed = channel.store.message_route_many(batch)
        if routed < len(batch):
            logger.warning(
                "kombu-akadze: %d of %d batched message(s) matched no bound queue and were dropped",
                len(batch) - routed,
                len(batch),
            )
