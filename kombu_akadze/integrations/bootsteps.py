"""Opt-ins for Celery worker bootsteps that Celery runs on amqp/redis only (see docs/remote-control.md)."""

from __future__ import annotations

#: Transport.driver_type of kombu-akadze, which Celery's bootsteps compare against their allow-lists.
DRIVER_TYPE = "akadze"


def enable_mingle() -> None:
    """Let Celery's own Mingle step (startup sync of the logical clock and of revoked task ids with the
    other workers) run on kombu-akadze workers; call it where the worker's Celery app is defined.

    Celery runs Mingle only where ``driver_type`` is amqp, redis or gcpubsub, as it needs a broadcast
    that reaches every worker and replies that come back: on kombu-akadze both go through exchanges and
    bindings in PostgreSQL, so the sync works. Celery's step is kept (its place before the task and
    control consumers matters), only its allow-list grows by ``"akadze"``; other transports are
    unaffected and ``--without-mingle`` still turns it off. The cost is RabbitMQ's: one broadcast and
    a one-second wait for replies at every consumer (re)start.
    """
    from celery.worker.consumer.mingle import Mingle

    Mingle.compatible_transports = {*Mingle.compatible_transports, DRIVER_TYPE}
