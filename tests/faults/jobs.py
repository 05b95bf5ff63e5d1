"""Tasks the fault tests' workers run (`celery -A examples.tasks worker --include faults.jobs`).

They touch no database: the broker is the only thing a fault can break. Each run appends
"<event> <n> <pid> <attempt> <message id> <unix time>" to the AKADZE_LEDGER file of its worker.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from celery import Task

from examples.tasks import app
from kombu_akadze import attempt_of, message_id_of

TOUCH = "faults.touch"
CHECK = "faults.check"


def ledger(event: str, n: int, task: Task) -> None:
    path = os.environ.get("AKADZE_LEDGER")
    if not path:
        return
    attempt = attempt_of(task.request)
    message_id = message_id_of(task.request)
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"{event} {n} {os.getpid()} {attempt} {message_id} {time.time():.6f}\n")


@app.task(bind=True, name=TOUCH)
def touch(self: Task, n: int, seconds: float = 0.0, later_seconds: float | None = None, pad: Any = None) -> int:
    """Sleep *seconds* (*later_seconds* on attempts after the first, if given), then record *n* as done."""
    ledger("start", n, self)
    attempt = attempt_of(self.request) or 1
    wait = seconds if later_seconds is None or attempt <= 1 else later_seconds
    deadline = time.monotonic() + wait
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))
    ledger("done", n, self)
    return n


@app.task(bind=True, name=CHECK)
def check(self: Task, n: int, text: str, sha256: str) -> int:
    """Record *n* as done only if *text* arrived intact (its SHA-256 matches), else as "corrupt"."""
    ledger("start", n, self)
    intact = hashlib.sha256(text.encode("utf-8")).hexdigest() == sha256
    ledger("done" if intact else "corrupt", n, self)
    return n
