"""A Celery app as a newcomer writes it, for tests/faults/test_mistakes.py: broker URL, transport options and
broker_transport from MISTAKES_BROKER_URL, MISTAKES_OPTIONS (JSON) and MISTAKES_TRANSPORT. It imports
kombu_akadze only when MISTAKES_IMPORT is set: a plain Python producer that never does is one of the mistakes."""

from __future__ import annotations

import json
import os

from celery import Celery

if os.environ.get("MISTAKES_IMPORT"):
    import kombu_akadze  # noqa: F401  (registers the akadze+ alias)

app = Celery("mistakes", broker=os.environ["MISTAKES_BROKER_URL"])
app.conf.update(
    broker_transport_options=json.loads(os.environ.get("MISTAKES_OPTIONS") or "{}"),
    broker_transport=os.environ.get("MISTAKES_TRANSPORT") or None,
    broker_connection_retry_on_startup=True,
)


@app.task(name="mistakes.add")
def add(x: int, y: int) -> int:
    return x + y
