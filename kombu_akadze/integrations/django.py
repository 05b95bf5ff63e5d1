"""Transactional enqueue from Django: the task message goes into the current transaction of a Django database.

Needs Django 4.2+ with the postgresql backend on psycopg 3. Django is imported only when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from kombu_akadze.errors import ConfigurationError
from kombu_akadze.integrations import outbox


def enqueue(
    signature_or_task: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    *,
    using: str = "default",
    **options: Any,
) -> Any:
    """:func:`kombu_akadze.integrations.outbox.enqueue` on Django's connection *using*; returns Celery's AsyncResult.

    Inside ``transaction.atomic()`` the message commits with your rows, and a rolled-back atomic
    block (or savepoint) leaves none. Outside one, Django's autocommit stores it at once.
    """
    connection = raw_connection(using)
    return outbox.enqueue(connection, signature_or_task, args, kwargs, **options)


def raw_connection(using: str = "default") -> Any:
    """The psycopg connection under Django's database *using*, opened if needed."""
    db = importlib.import_module("django.db")
    wrapper = db.connections[using]
    if wrapper.vendor != "postgresql":
        raise ConfigurationError(
            f"kombu_akadze.integrations.django.enqueue: database {using!r} is {wrapper.vendor}, not PostgreSQL; "
            "transactional enqueue needs the queue in the same database as your rows"
        )
    wrapper.ensure_connection()
    wrapper.validate_no_broken_transaction()  # Django's own error for an atomic block already doomed
    return wrapper.connection
