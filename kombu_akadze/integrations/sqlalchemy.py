"""Transactional enqueue from SQLAlchemy: the task message goes into a Session's or Connection's transaction.

Needs the psycopg (v3) dialect, ``postgresql+psycopg://``. SQLAlchemy is imported only when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from typing import Any

from kombu_akadze.errors import ConfigurationError
from kombu_akadze.integrations import outbox


def enqueue(
    bind: Any,
    signature_or_task: Any,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    **options: Any,
) -> Any:
    """:func:`kombu_akadze.integrations.outbox.enqueue` in the transaction of *bind* (a Session or a Connection).

    A Session begins its transaction if it has none yet; the message commits with ``session.commit()``
    and is gone with ``session.rollback()`` or a rolled-back ``begin_nested()``.
    """
    return outbox.enqueue(raw_connection(bind), signature_or_task, args, kwargs, **options)


def raw_connection(bind: Any) -> Any:
    """The psycopg connection under a SQLAlchemy Session, scoped_session or Connection."""
    engine = importlib.import_module("sqlalchemy.engine")
    orm = importlib.import_module("sqlalchemy.orm")
    if isinstance(bind, orm.Session | orm.scoped_session):
        bind = bind.connection()
    if not isinstance(bind, engine.Connection):
        raise TypeError(
            f"kombu_akadze.integrations.sqlalchemy.enqueue needs a Session or a Connection, not {type(bind).__name__} "
            "(an Engine has no transaction of yours: use `with engine.begin() as conn:`)"
        )
    driver = bind.dialect.driver
    if bind.dialect.name != "postgresql" or driver != "psycopg":
        raise ConfigurationError(
            f"kombu_akadze.integrations.sqlalchemy.enqueue needs the postgresql+psycopg dialect (psycopg 3), not "
            f"{bind.dialect.name}+{driver}: use a postgresql+psycopg:// URL"
        )
    return bind.connection.driver_connection
