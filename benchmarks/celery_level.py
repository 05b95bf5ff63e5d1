"""Workloads b and c: a real `celery worker` subprocess draining a pre-enqueued batch, then enqueue->start latency."""

from __future__ import annotations

import contextlib
import math
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import celeryapp
import redis
from brokers import Broker

HERE = Path(__file__).resolve().parent


class WorkerFailed(RuntimeError):
    """The worker exited or never became ready; the message carries the tail of its log."""


#: The pool of workloads b, c and d; the fleet (fleet.py) runs `-P solo` workers instead.
PREFORK_2 = ("-P", "prefork", "-c", "2")


class Worker:
    """One `celery worker` (by default `-P prefork -c 2`) in its own process group, logging to a file."""

    def __init__(
        self,
        broker: Broker,
        *,
        queue: str,
        prefetch: int,
        key: str,
        redis_url: str,
        logdir: Path,
        pool: tuple[str, ...] = PREFORK_2,
        remote_control: bool = False,
    ) -> None:
        self.pool = pool
        self.env = broker.celery_env(
            queue=queue, prefetch=prefetch, key=key, redis_url=redis_url, remote_control=remote_control
        )
        self.queue = queue
        self.prefetch = prefetch
        self.key = key
        self.redis = redis.Redis.from_url(redis_url)
        self.log_path = logdir / f"{queue}-{key.rsplit(':', 2)[-2]}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        settle()
        cmd = [
            sys.executable, "-m", "celery", "--workdir", str(HERE), "-A", "celeryapp", "worker",
            *self.pool, "-Q", self.queue, "--prefetch-multiplier", str(self.prefetch),
            "-l", "WARNING", "--without-heartbeat", "--without-gossip", "--without-mingle",
            "-n", f"bench-{uuid.uuid4().hex[:6]}@%h",
        ]  # fmt: skip
        # run.py put its snapshot of kombu_akadze first on PYTHONPATH; cwd=HERE keeps the live tree off sys.path.
        path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH", ""), str(HERE)) if p)
        env = {**os.environ, **self.env, "PYTHONPATH": path}
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=HERE, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout: float = 60.0) -> float:
        """The worker's own 'start consuming' timestamp (worker_ready signal)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stamp = self.redis.get(self.key + "ready")
            if stamp is not None:
                return float(stamp)
            self.check_alive()
            time.sleep(0.02)
        raise WorkerFailed(f"worker not ready after {timeout:.0f} s\n{self.log_tail()}")

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise WorkerFailed(f"worker exited with code {self.proc.returncode}\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no worker log)"
        return f"--- {self.log_path} (last {lines} lines) ---\n" + "\n".join(text[-lines:])

    def stop(self, timeout: float = 20.0) -> None:
        """Cold shutdown (SIGQUIT), then SIGKILL to the worker's own process group if it hangs.

        Every measured task is done by now; a warm shutdown (SIGTERM) of the prefork pool
        takes ~6 s here against ~2 s, and would only make the run longer.
        """
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGQUIT)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    def log_errors(self) -> list[str]:
        """ERROR/CRITICAL lines of the worker log, and the exception line that ends each traceback."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        found, in_trace = [], False
        for line in text:
            if line.startswith("Traceback"):
                in_trace = True
            elif in_trace and line and not line.startswith(" "):
                found.append("Traceback ... " + line)
                in_trace = False
            elif "ERROR" in line or "CRITICAL" in line:
                found.append(line)
        return found


def enqueue(broker: Broker, queue: str, task: str, args: tuple[Any, ...], count: int) -> float:
    """Send *count* tasks through Celery's own producer; seconds taken."""
    app = celeryapp.make_app(
        {
            "broker_url": broker.url,
            "broker_transport_options": broker.transport_options,
            "task_default_queue": queue,
        }
    )
    start = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for _ in range(count):
            app.send_task(task, args=args, queue=queue, producer=producer)
    elapsed = time.perf_counter() - start
    app.close()
    return elapsed


def purge(broker: Broker, queue: str) -> None:
    with broker.connection() as conn, contextlib.suppress(Exception):  # a queue never declared: nothing to purge
        conn.default_channel.queue_purge(queue)


def drain(
    broker: Broker,
    *,
    run_id: str,
    kind: str,
    total: int,
    prefetch: int,
    cap: float,
    redis_url: str,
    logdir: Path,
    latency: tuple[float, float] | None = None,
    log: Callable[[str], None] = print,
    remote_control: bool = False,
) -> dict[str, Any]:
    """tasks/s from worker_ready to the last task done; with *latency*=(rate, seconds), then run workload c.
    *remote_control* runs the worker with Celery's default (on), which consumes its pidbox queue too."""
    tag = uuid.uuid4().hex[:8]
    queue = broker.queue_name(f"celery-{kind}-p{prefetch}{'-rc' if remote_control else ''}-{tag}", run_id)
    key = f"akadze-bench:{run_id}:{tag}:"
    task, args = (celeryapp.NOOP, (total,)) if kind == "noop" else (celeryapp.SLEEP, (total, 0.010))
    out: dict[str, Any] = {}
    if total:
        enqueue_secs = enqueue(broker, queue, task, args, total)
        out["enqueue_per_s"] = total / enqueue_secs
    worker = Worker(
        broker, queue=queue, prefetch=prefetch, key=key, redis_url=redis_url, logdir=logdir,
        remote_control=remote_control,
    )  # fmt: skip
    client = worker.redis
    try:
        worker.start()
        ready_at = worker.wait_ready()
        if total:
            out.update(wait_done(worker, client, key, total, ready_at, cap))
            if out.get("partial"):
                log(f"{kind} prefetch {prefetch}: {out['done']} of {total} tasks in the {cap:.0f} s cap")
                purge(broker, queue)  # the latency phase must not queue behind the rest of the batch
        if latency is not None:
            out["latency"] = measure_latency(broker, queue, worker, client, key, rate=latency[0], seconds=latency[1])
    finally:
        stop_in_background(worker, broker, queue, log)
    return out


# Workers shutting down while the next batch is enqueued (enqueue rates are not a reported figure);
# Worker.start() waits for all of them, so no measurement shares the cores with a dying worker.
_stopping: list[threading.Thread] = []
#: (worker log, error lines) of every stopped worker whose log shows errors, shutdown included.
WORKER_ERRORS: list[tuple[str, list[str]]] = []


def settle() -> None:
    """Wait until every worker this process started has exited and its queue and keys are cleaned."""
    while _stopping:
        _stopping.pop().join()


def stop_in_background(worker: Worker, broker: Broker, queue: str, log: Callable[[str], None]) -> None:
    def finish() -> None:
        try:
            worker.stop()
            errors = worker.log_errors()
            if errors:
                WORKER_ERRORS.append((str(worker.log_path), errors[:20]))
                log(f"worker log has {len(errors)} error line(s): {worker.log_path}")
            purge(broker, queue)
            for k in worker.redis.scan_iter(match=worker.key + "*"):
                worker.redis.delete(k)
        except Exception as exc:
            log(f"!! stopping the worker of {queue}: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=finish, name=f"stop-{queue}")
    thread.start()
    _stopping.append(thread)


def wait_done(worker: Worker, client: redis.Redis, key: str, total: int, ready_at: float, cap: float) -> dict[str, Any]:
    deadline = ready_at + cap
    while time.time() < deadline:
        done_at = client.get(key + "done")
        if done_at is not None:
            return {"tasks_per_s": total / (float(done_at) - ready_at), "seconds": float(done_at) - ready_at}
        worker.check_alive()
        time.sleep(0.02)
    done = int(client.get(key + "count") or 0)
    return {"tasks_per_s": done / cap, "seconds": cap, "partial": True, "done": done}


def measure_latency(
    broker: Broker, queue: str, worker: Worker, client: redis.Redis, key: str, *, rate: float, seconds: float
) -> dict[str, float]:
    """Send LATENCY tasks at *rate*/s for *seconds*; each records start time minus its send time."""
    count = int(rate * seconds)
    app = celeryapp.make_app(
        {"broker_url": broker.url, "broker_transport_options": broker.transport_options, "task_default_queue": queue}
    )
    with app.producer_or_acquire() as producer:
        start = time.perf_counter()
        for i in range(count):
            pause = start + i / rate - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            app.send_task(celeryapp.LATENCY, args=(time.time(),), queue=queue, producer=producer)
    app.close()
    deadline = time.monotonic() + 15.0
    while client.llen(key + "latency") < count and time.monotonic() < deadline:
        worker.check_alive()
        time.sleep(0.05)
    values = sorted(float(v) * 1000.0 for v in client.lrange(key + "latency", 0, -1))
    if not values:
        raise WorkerFailed(f"no latency task started in 15 s\n{worker.log_tail()}")
    return {
        "p50_ms": statistics.median(values),
        "p99_ms": percentile(values, 99),
        "max_ms": values[-1],
        "count": float(len(values)),
        "sent": float(count),
    }


def percentile(ordered: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]
