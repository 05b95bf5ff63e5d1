"""Transactional enqueue through SQLAlchemy sessions and Django's atomic blocks, on real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from psycopg.conninfo import conninfo_to_dict

from kombu_akadze.errors import ConfigurationError
from kombu_akadze.store import Store

ADD = "outbox_frameworks_test.add"


def add(x: int, y: int) -> int:
    return x + y


@pytest.fixture
def app(pg_url: str, schema: str) -> Iterator[Celery]:
    celery_app = Celery("outbox_frameworks_test", broker=f"akadze+{pg_url}", set_as_current=False)
    celery_app.conf.update(broker_transport_options={"schema": schema}, task_ignore_result=True)
    celery_app.task(name=ADD, shared=False)(add)
    yield celery_app
    celery_app.close()


# -- SQLAlchemy ---------------------------------------------------------------


@pytest.fixture
def engine(pg_url: str) -> Iterator[Any]:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    engine = sqlalchemy.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg://", 1))
    yield engine
    engine.dispose()


def test_sqlalchemy_session_commit_keeps_rollback_and_nested_rollback_drop(
    engine: Any, app: Celery, store: Store
) -> None:
    from sqlalchemy.orm import Session

    from kombu_akadze.integrations import sqlalchemy as akadze_sa

    with Session(engine) as session:
        akadze_sa.enqueue(session, app.tasks[ADD], (1, 1))
        session.rollback()
        akadze_sa.enqueue(session, app.tasks[ADD], (2, 2))
        nested = session.begin_nested()
        akadze_sa.enqueue(session, app.tasks[ADD], (3, 3))
        nested.rollback()
        assert store.message_counts() == {}
        session.commit()
    counts = store.message_counts()
    assert counts == {("celery", "ready"): 1}
    (row,) = store.message_claim(queues=["celery"], limits=[5], owner="test")
    assert row.body.startswith(b"[[2, 2]")


def test_sqlalchemy_connection_in_engine_begin(engine: Any, app: Celery, store: Store) -> None:
    from kombu_akadze.integrations import sqlalchemy as akadze_sa

    with engine.begin() as connection:
        akadze_sa.enqueue(connection, ADD, (1, 2), app=app)
        assert store.message_counts() == {}
    assert store.message_counts() == {("celery", "ready"): 1}


def test_sqlalchemy_needs_the_psycopg_3_dialect(pg_url: str, app: Celery) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    pytest.importorskip("psycopg2")
    from kombu_akadze.integrations import sqlalchemy as akadze_sa

    engine = sqlalchemy.create_engine(pg_url.replace("postgresql://", "postgresql+psycopg2://", 1))
    with engine.connect() as connection, pytest.raises(ConfigurationError, match=r"postgresql\+psycopg://"):
        akadze_sa.enqueue(connection, app.tasks[ADD], (1, 2))
    engine.dispose()
    with pytest.raises(TypeError, match=r"engine\.begin"):
        akadze_sa.enqueue(engine, app.tasks[ADD], (1, 2))


# -- Django -------------------------------------------------------------------


@pytest.fixture
def django_db(pg_url: str) -> Iterator[Any]:
    """Django configured once per process on the test database (settings cannot be configured twice)."""
    django = pytest.importorskip("django")
    from django.conf import settings

    if not settings.configured:
        settings.configure(DATABASES={"default": django_database(pg_url)}, INSTALLED_APPS=[], USE_TZ=True)
        django.setup()
    from django.db import connections

    yield connections["default"]
    connections.close_all()


def django_database(url: str) -> dict[str, Any]:
    params = conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": params.get("dbname", ""),
        "USER": params.get("user", ""),
        "PASSWORD": params.get("password", ""),
        "HOST": params.get("host", ""),
        "PORT": params.get("port", ""),
    }


def test_django_atomic_commit_keeps_rollback_and_savepoint_rollback_drop(
    django_db: Any, app: Celery, store: Store
) -> None:
    from django.db import transaction

    from kombu_akadze.integrations import django as akadze_django

    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back(akadze_django, app, (1, 1))
    with transaction.atomic():
        akadze_django.enqueue(app.tasks[ADD], (2, 2))
        with pytest.raises(RuntimeError), transaction.atomic():  # a savepoint
            rolled_back(akadze_django, app, (3, 3))
        assert store.message_counts() == {}
    assert store.message_counts() == {("celery", "ready"): 1}
    (row,) = store.message_claim(queues=["celery"], limits=[5], owner="test")
    assert row.body.startswith(b"[[2, 2]")
    assert row.headers["task"] == ADD


def rolled_back(akadze_django: Any, app: Celery, args: tuple[int, int]) -> None:
    akadze_django.enqueue(app.tasks[ADD], args)
    raise RuntimeError("this atomic block rolls back")


def test_django_outside_atomic_autocommits_like_a_plain_publish(django_db: Any, app: Celery, store: Store) -> None:
    from kombu_akadze.integrations import django as akadze_django

    akadze_django.enqueue(ADD, (5, 5), app=app)
    assert store.message_counts() == {("celery", "ready"): 1}
