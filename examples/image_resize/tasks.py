"""The resize worker: ``celery -A examples.image_resize.tasks worker``.

Each message names one image. The task is idempotent, keyed by the image id and the width: a
redelivered message (after a worker crash, kombu-akadze delivers at least once) finds the
thumbnail already there and does nothing. A transient storage error (the upload is still in
progress) is retried with a growing countdown; a permanent one (no such image, not an image,
retries used up) is rejected without requeue, so the message goes to the dead letters, where
``akadze dead list`` shows it (the worker's log says why) and ``akadze dead replay`` puts it back.

Environment: AKADZE_URL (libpq URL; unset: the embedded server) and AKADZE_TRANSPORT_OPTIONS
(a JSON object, e.g. {"schema": "images"}).
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from celery import Celery, Task
from celery.exceptions import Reject

import kombu_akadze  # noqa: F401  (registers akadze+ for producers; the celery command does it by itself)
from examples.image_resize import images

RESIZE = "examples.image_resize.resize"
#: Retries of a transient error before the message goes to the dead letters.
MAX_RETRIES = 5
#: Seconds before the first retry; doubled for each later one (2, 4, 8, ... s).
RETRY_BASE = float(os.environ.get("RESIZE_RETRY_BASE", "2"))
_TRANSIENT_ERRNOS = {errno.EAGAIN, errno.EBUSY, errno.EIO, errno.ENOSPC, errno.ETIMEDOUT}


class StorageBusyError(Exception):
    """The image cannot be read right now, but may be in a moment: retry."""


def make_app() -> Celery:
    url = os.environ.get("AKADZE_URL", "")
    celery_app = Celery("examples.image_resize")
    celery_app.conf.update(
        broker_url="akadze+" + url if url else "akadze://",
        broker_transport_options=json.loads(os.environ.get("AKADZE_TRANSPORT_OPTIONS") or "{}"),
        broker_connection_retry_on_startup=True,
        task_acks_late=True,  # ack after the thumbnail is written: a crash redelivers
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,  # one image at a time per process: the work queue
        task_ignore_result=True,
    )
    return celery_app


app = make_app()


def thumbnail_path(out_dir: str | Path, image_id: str, width: int) -> Path:
    return Path(out_dir) / f"{image_id}-w{width}.pgm"


@app.task(bind=True, name=RESIZE, max_retries=MAX_RETRIES)
def resize(self: Task, image_id: str, source: str, width: int, out_dir: str) -> str:
    """Write the *width*-pixel thumbnail of *source*; ``already done`` if it exists."""
    target = thumbnail_path(out_dir, image_id, width)
    if target.exists():
        return "already done"
    try:
        data = read_source(Path(source))
    except StorageBusyError as exc:
        retries = self.request.retries
        if retries >= MAX_RETRIES:
            raise Reject(f"{source}: still unreadable after {retries} retries: {exc}", requeue=False) from exc
        raise self.retry(exc=exc, countdown=RETRY_BASE * 2**retries) from exc
    try:
        thumbnail = images.resize(images.parse(data), width)
    except images.NotAnImageError as exc:
        raise Reject(f"{source}: {exc}", requeue=False) from exc
    images.write_atomically(target, images.encode(thumbnail))
    return "resized"


def read_source(path: Path) -> bytes:
    """The image's bytes; StorageBusyError while it is still uploading (``<name>.part`` exists)."""
    try:
        return path.read_bytes()
    except FileNotFoundError as exc:
        if path.with_name(path.name + ".part").exists():
            raise StorageBusyError(f"{path.name} is still uploading") from exc
        raise Reject(f"{path}: no such image", requeue=False) from exc
    except OSError as exc:
        if exc.errno in _TRANSIENT_ERRNOS:
            raise StorageBusyError(str(exc)) from exc
        raise
