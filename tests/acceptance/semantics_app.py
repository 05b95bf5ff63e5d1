"""The Celery app of the worker-semantics acceptance tests: examples.tasks' configuration plus per-test settings.

Environment (besides the AKADZE_* variables of examples.tasks)
  AKADZE_CELERY_CONF   JSON object merged into the Celery configuration (task_routes, result_backend, ...)
  AKADZE_SEM_LEDGER    file every task appends one JSON line per event to: what the tests count

Like examples.tasks it never imports kombu_akadze: the worker finds the transport through the URL alias.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Mapping
from typing import Any

from celery import Celery, Task
from celery.exceptions import Reject, SoftTimeLimitExceeded

from examples.tasks import demo_table, make_app
from kombu_akadze import attempt_of, message_id_of


def make_semantics_app(environ: Mapping[str, str]) -> Celery:
    """examples.tasks.make_app(environ), then AKADZE_CELERY_CONF on top."""
    celery_app = make_app(environ)
    overrides = json.loads(environ.get("AKADZE_CELERY_CONF") or "{}")
    if not isinstance(overrides, dict):
        raise TypeError(f"AKADZE_CELERY_CONF must be a JSON object, not {overrides!r}")
    celery_app.conf.update(overrides)
    return celery_app


app = make_semantics_app(os.environ)


class FlakyError(Exception):
    """Raised by `sem.flaky` until its retries are used up (autoretry_for)."""


def note(task: Task, event: str, key: int, **extra: Any) -> None:
    """Append one event of the running task to AKADZE_SEM_LEDGER."""
    path = os.environ.get("AKADZE_SEM_LEDGER")
    if not path:
        return
    request = task.request
    delivery = request.delivery_info or {}
    line = {
        "event": event,
        "key": key,
        "task": task.name,
        "id": request.id,
        "pid": os.getpid(),
        "hostname": request.hostname,
        "t": time.time(),
        "attempt": attempt_of(request),
        "message_id": message_id_of(request),
        "redelivered": delivery.get("redelivered"),
        "routing_key": delivery.get("routing_key"),
        "retries": request.retries,
        "eta": request.eta,
        **extra,
    }
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line, default=str) + "\n")


def nap(seconds: float) -> None:
    """Sleep *seconds* (GIL released) in short steps, on the monotonic clock."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.1))


def first_run(task: Task) -> bool:
    attempt = attempt_of(task.request)
    return attempt is None or attempt <= 1


def finish(task: Task, key: int) -> int:
    """Record *key* in the demo table (a second run only bumps its count) and note it done."""
    runs = demo_table().record(key)
    note(task, "done", key, runs=runs)
    return runs


@app.task(bind=True, name="sem.work")
def work(self: Task, key: int, seconds: float = 0.0, later_seconds: float | None = None) -> int:
    """Sleep *seconds* (*later_seconds* on attempts after the first, if given), then record *key*."""
    note(self, "start", key)
    nap(seconds if later_seconds is None or first_run(self) else later_seconds)
    return finish(self, key)


@app.task(bind=True, name="sem.strict", acks_on_failure_or_timeout=False)
def strict(self: Task, key: int, seconds: float = 0.0, fail: bool = False) -> int:
    """Like sem.work, with acks_on_failure_or_timeout=False; *fail* raises instead of recording."""
    note(self, "start", key)
    nap(seconds)
    if fail:
        raise RuntimeError(f"sem.strict({key}) fails on purpose")
    return finish(self, key)


@app.task(bind=True, name="sem.fail")
def fail(self: Task, key: int) -> None:
    """Always raises (default acks_on_failure_or_timeout)."""
    note(self, "start", key)
    raise RuntimeError(f"sem.fail({key}) fails on purpose")


def _gil_chunk(seconds: float) -> None:
    """One C-level call that holds the GIL for about *seconds* (sum over a range never yields it)."""
    probe = 2_000_000
    started = time.perf_counter()
    sum(range(probe))
    rate = probe / max(time.perf_counter() - started, 1e-6)
    sum(range(int(rate * seconds)))


def _started_elsewhere(key: int) -> bool:
    """Another process has noted a start of *key* in the ledger (another worker runs it again)."""
    path = os.environ.get("AKADZE_SEM_LEDGER")
    if not path or not os.path.exists(path):
        return False
    with open(path, encoding="utf-8") as ledger:
        lines = ledger.read().splitlines()
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:  # a line another process is appending right now
            continue
        if event.get("event") == "start" and event.get("key") == key and event.get("pid") != os.getpid():
            return True
    return False


@app.task(bind=True, name="sem.spin")
def spin(self: Task, key: int, seconds: float, chunk: float, until_run_elsewhere: bool = False) -> int:
    """CPU-bound for at least *seconds*, in calls that each hold the GIL for about *chunk* seconds; with
    *until_run_elsewhere*, also until another worker has started *key* (at most 300 s): a worker started
    after this one still finds it silent, however long its own start takes."""
    note(self, "start", key)
    started = time.monotonic()
    chunks = 0
    while time.monotonic() - started < seconds or (
        until_run_elsewhere and time.monotonic() - started < 300 and not _started_elsewhere(key)
    ):
        _gil_chunk(chunk)
        chunks += 1
    note(self, "spun", key, seconds=time.monotonic() - started, chunks=chunks)
    return finish(self, key)


@app.task(bind=True, name="sem.suicide")
def suicide(self: Task, key: int, die_on: list[int] | None = None, seconds: float = 0.3) -> int:
    """SIGKILL the pool child running it on the attempts in *die_on* (None: every attempt)."""
    note(self, "start", key)
    nap(seconds)  # let the worker see the task as started (time_start set) before the child dies
    attempt = attempt_of(self.request)
    if die_on is None or attempt in die_on:
        note(self, "dying", key)
        os.kill(os.getpid(), signal.SIGKILL)
    return finish(self, key)


@app.task(bind=True, name="sem.reject")
def reject(self: Task, key: int, requeue: bool) -> None:
    """Reject the message (Celery's Reject exception) with or without requeue."""
    note(self, "start", key)
    raise Reject(f"sem.reject({key}) rejects on purpose", requeue=requeue)


@app.task(bind=True, name="sem.retrying")
def retrying(self: Task, key: int, times: int, countdown: float = 1.0) -> int:
    """self.retry(countdown=...) *times* times, then record *key*."""
    note(self, "start", key)
    if self.request.retries < times:
        raise self.retry(countdown=countdown, max_retries=times)
    return finish(self, key)


@app.task(bind=True, name="sem.flaky", autoretry_for=(FlakyError,), retry_kwargs={"countdown": 1}, max_retries=5)
def flaky(self: Task, key: int, fails: int) -> int:
    """Raise FlakyError on the first *fails* runs (autoretry_for retries it), then record *key*."""
    note(self, "start", key)
    if self.request.retries < fails:
        raise FlakyError(f"sem.flaky({key}) run {self.request.retries} fails on purpose")
    return finish(self, key)


@app.task(bind=True, name="sem.soft")
def soft(self: Task, key: int, seconds: float) -> int:
    """Sleep *seconds*; a soft time limit on the way is caught, noted, and the task records *key* anyway."""
    note(self, "start", key)
    try:
        nap(seconds)
    except SoftTimeLimitExceeded:
        note(self, "soft_limit", key)
    return finish(self, key)


@app.task(bind=True, name="sem.route_a")
def route_a(self: Task, key: int) -> int:
    note(self, "start", key)
    return finish(self, key)


@app.task(bind=True, name="sem.route_b")
def route_b(self: Task, key: int) -> int:
    note(self, "start", key)
    return finish(self, key)


@app.task(name="sem.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="sem.tsum")
def tsum(values: list[int]) -> int:
    return sum(values)
