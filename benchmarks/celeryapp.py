"""The Celery app that benchmark workers run, configured from BENCH_* environment variables.

Every broker gets the same app and the same tasks; the only thing a task does
besides its (tiny) work is one Redis round trip, the neutral completion counter.

BENCH_BROKER_URL          broker URL (akadze+postgresql://..., pyamqp://..., redis://..., sqla+...)
BENCH_TRANSPORT_OPTIONS   JSON object, Celery's broker_transport_options
BENCH_QUEUE               the queue the tasks go to and the worker consumes
BENCH_PREFETCH            worker_prefetch_multiplier
BENCH_REMOTE_CONTROL      "1": worker_enable_remote_control on (Celery's default), else off
BENCH_REDIS_URL           where the counter, the ready stamp and latencies are written
BENCH_KEY                 key prefix of this worker run in that Redis
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, signals

import kombu_akadze  # noqa: F401  (registers the akadze+ URL scheme in this process)

NOOP = "bench.noop"
SLEEP = "bench.sleep"
LATENCY = "bench.latency"


def settings_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, Any]:
    return {
        "broker_url": env.get("BENCH_BROKER_URL", "memory://"),
        "broker_transport_options": json.loads(env.get("BENCH_TRANSPORT_OPTIONS", "{}")),
        "task_default_queue": env.get("BENCH_QUEUE", "bench"),
        "worker_prefetch_multiplier": int(env.get("BENCH_PREFETCH", "1")),
        # Off by default, as written for virtual transports that lacked fanout. Celery itself leaves it
        # on, and skips it on a transport without fanout: the b.noop_p1_rc row runs that default.
        "worker_enable_remote_control": env.get("BENCH_REMOTE_CONTROL") == "1",
    }


def make_app(settings: dict[str, Any]) -> Celery:
    """One Celery app; the benchmark's parent process makes one per broker to enqueue."""
    app = Celery("bench", set_as_current=False)
    app.conf.update(
        {
            "task_acks_late": True,
            "task_ignore_result": True,
            "task_serializer": "json",
            "accept_content": ["json"],
            "worker_enable_remote_control": False,
            "worker_send_task_events": False,
            "broker_connection_retry_on_startup": True,
            "worker_hijack_root_logger": False,
            **settings,
        }
    )
    return app


app = make_app(settings_from_env())

_redis: tuple[int, redis.Redis] | None = None


def counter() -> redis.Redis:
    """A Redis client of this process (pool children must not share the parent's socket)."""
    global _redis
    if _redis is None or _redis[0] != os.getpid():
        _redis = (os.getpid(), redis.Redis.from_url(os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")))
    return _redis[1]


def key(name: str) -> str:
    return os.environ.get("BENCH_KEY", "akadze-bench:") + name


def _count(total: int) -> None:
    done = counter().incr(key("count"))
    if done == total:
        counter().set(key("done"), repr(time.time()))


@app.task(name=NOOP)
def noop(total: int) -> None:
    _count(total)


@app.task(name=SLEEP)
def sleep(total: int, seconds: float) -> None:
    time.sleep(seconds)
    _count(total)


@app.task(name=LATENCY)
def latency(sent_at: float) -> None:
    started = time.time()
    client = counter()
    client.rpush(key("latency"), repr(started - sent_at))
    client.rpush(key("latency_at"), f"{sent_at!r} {started!r}")  # which send it was (fleet.py splits it)


@signals.worker_ready.connect
def _stamp_ready(**_: Any) -> None:
    # Sent by the consumer right before it enters its event loop: "start consuming".
    counter().set(key("ready"), repr(time.time()))
