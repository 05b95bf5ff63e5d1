"""The Celery app of the remote-control tests (examples.tasks' app and tasks) and the clients they kill -9.

Environment (besides the AKADZE_* variables of examples.tasks)
  AKADZE_CELERY_CONF   JSON object merged into the Celery configuration (control_queue_expires, ...)
  AKADZE_MINGLE        "1": kombu_akadze.integrations.bootsteps.enable_mingle() (Mingle is off on akadze otherwise)

Clients: ``python -m tests.acceptance.remote_control_app MODE [FILE]`` prints one line, then runs until
it is killed:
  inspect   "inspecting", then one `inspect ping` that collects replies for an hour (its reply queue,
            named after the call, not known in advance, stays consumed)
  events    the name of its queue, then receives every event type, one JSON line each appended to FILE
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from celery import Celery

from examples.tasks import app as example_app


def configure(celery_app: Celery) -> Celery:
    overrides = json.loads(os.environ.get("AKADZE_CELERY_CONF") or "{}")
    if not isinstance(overrides, dict):
        raise TypeError(f"AKADZE_CELERY_CONF must be a JSON object, not {overrides!r}")
    celery_app.conf.update(overrides)
    if os.environ.get("AKADZE_MINGLE") == "1":
        from kombu_akadze.integrations.bootsteps import enable_mingle

        enable_mingle()
    return celery_app


app = configure(example_app)


def inspect_forever() -> None:
    print("inspecting", flush=True)
    app.control.inspect(timeout=3600).ping()


def events_forever(path: str) -> None:
    with app.connection() as conn, open(path, "a", encoding="utf-8") as out:

        def on_event(event: dict[str, Any]) -> None:
            line = {k: event.get(k) for k in ("type", "hostname", "uuid", "timestamp")}
            out.write(json.dumps({**line, "seen": time.time()}) + "\n")
            out.flush()

        receiver = app.events.Receiver(conn, handlers={"*": on_event})
        print(receiver.queue.name, flush=True)
        receiver.capture(limit=None, timeout=None, wakeup=True)


if __name__ == "__main__":
    import kombu_akadze  # noqa: F401  (a plain python process: the celery CLI's entry point registers the alias)

    if sys.argv[1] == "inspect":
        inspect_forever()
    else:
        events_forever(sys.argv[2])
