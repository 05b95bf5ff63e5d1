"""Public pytest helpers for users' own test suites: a real PostgreSQL, a fresh schema, waiting on conditions."""

from __future__ import annotations

import os
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from kombu_akadze import embedded
from kombu_akadze.store import Store, migrate

T = TypeVar("T")


def eventually(predicate: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, what: str = "") -> T:
    """Return *predicate()*'s first truthy value, polling until *timeout* seconds; fail loudly after."""
    deadline = time.monotonic() + timeout
    last: T = predicate()
    while not last:
        if time.monotonic() >= deadline:
            raise AssertionError(f"condition not met within {timeout} s: {what or predicate!r} (last: {last!r})")
        time.sleep(interval)
        last = predicate()
    return last


def database_url() -> str:
    """AKADZE_TEST_URL if set (e.g. a local server), else a throwaway embedded PostgreSQL."""
    url = os.environ.get("AKADZE_TEST_URL")
    if url:
        return url
    return embedded.start(tempfile.mkdtemp(prefix="akadze-test-pg-"), throwaway=True)


@contextmanager
def fresh_schema(url: str, *, prefix: str = "t") -> Iterator[str]:
    """A migrated, uniquely named schema, dropped afterwards."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    migrate.apply(url, schema)
    try:
        yield schema
    finally:
        drop_schema(url, schema)


def drop_schema(url: str, schema: str) -> None:
    migrate.drop(url, schema)
    migrate.forget_checks()


def store_for(url: str, schema: str) -> Store:
    return Store(url, schema=schema, role="test")
