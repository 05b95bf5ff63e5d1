"""The examples run: image resize on a real (in-process) worker, the Django outbox, the migration walk-through."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import signals
from celery.contrib.testing.worker import start_worker

from kombu_akadze.integrations.testing import eventually
from kombu_akadze.store import DeadLetterFilter, Store

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # examples/ is not installed

from examples.image_resize import images, produce  # noqa: E402
from examples.image_resize import tasks as resize_tasks  # noqa: E402


def test_pgm_resize_keeps_the_aspect_ratio_and_refuses_what_is_not_an_image() -> None:
    image = images.sample(320, 240, seed=3)
    thumbnail = images.parse(images.encode(images.resize(image, 64)))
    assert (thumbnail.width, thumbnail.height, len(thumbnail.pixels)) == (64, 48, 64 * 48)
    assert thumbnail.pixels[0] == image.pixels[0]
    for bad in (b"this is not an image", b"P5\n4 4\n255\n" + b"\x00" * 3, b"P5\n0 4\n255\n"):
        with pytest.raises(images.NotAnImageError):
            images.parse(bad)


@pytest.fixture
def resize_worker(pg_url: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The example's app on the test schema, with a solo worker in this process."""
    app = resize_tasks.app
    # Celery's in-process test worker writes an ack only at the next safety poll (a real `celery
    # worker` writes it at once), so that poll is short here.
    options = {"schema": schema, "poll_interval": 0.2, "listen_poll_interval": 0.5}
    app.conf.update(broker_url=f"akadze+{pg_url}", broker_transport_options=options)
    monkeypatch.setattr(resize_tasks, "RETRY_BASE", 0.1)
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
            yield app
    finally:
        app.close()
        root.setLevel(level)  # the worker's logging setup raised the root level and added a handler
        root.handlers[:] = handlers


def test_image_resize_thumbnails_retries_uploads_and_dead_letters_broken_files(
    resize_worker: Any, store: Store, tmp_path: Path
) -> None:
    folder, out = tmp_path / "images", tmp_path / "thumbs"
    folder.mkdir()
    produce.make_samples(folder, 2, broken=True)
    uploading = folder / "late.pgm"
    (folder / "late.pgm.part").write_bytes(b"")  # its upload is in progress: a transient error
    retried, outcomes = threading.Event(), []

    def on_retry(**kw: Any) -> None:
        retried.set()

    def on_success(result: str, **kw: Any) -> None:
        outcomes.append(result)

    signals.task_retry.connect(on_retry, weak=False)
    signals.task_success.connect(on_success, weak=False)
    try:
        assert produce.enqueue_folder(folder, out, 32) == ["broken", "sample-000", "sample-001"]
        resize_tasks.resize.delay("late", str(uploading), 32, str(out))
        resize_tasks.resize.delay("sample-000", str(folder / "sample-000.pgm"), 32, str(out))  # a duplicate
        assert retried.wait(30), "the task for the image still uploading was never retried"
        images.write_atomically(uploading, images.encode(images.sample(64, 64)))  # the upload completes
        eventually(lambda: len(outcomes) >= 4, timeout=30, what="4 resize tasks succeeded")
        eventually(lambda: store.message_counts() == {}, timeout=30, what="every message settled")
    finally:
        signals.task_retry.disconnect(on_retry)
        signals.task_success.disconnect(on_success)

    assert sorted(outcomes) == ["already done", "resized", "resized", "resized"]
    assert sorted(p.name for p in out.iterdir()) == ["late-w32.pgm", "sample-000-w32.pgm", "sample-001-w32.pgm"]
    (dead,) = store.deadletter_find(where=DeadLetterFilter(task=resize_tasks.RESIZE))
    assert dead.queue == "celery"
    assert dead.reason.startswith("rejected by consumer")
    letter = store.deadletter_get(message_id=dead.id)
    assert letter is not None
    assert json.loads(letter.body)[0][0] == "broken"


def test_django_outbox_example_commits_the_order_and_its_task_together(pg_url: str, schema: str, store: Store) -> None:
    pytest.importorskip("django")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AKADZE_")}
    env.update(
        AKADZE_URL=pg_url,
        AKADZE_TRANSPORT_OPTIONS=json.dumps({"schema": schema}),
        DJANGO_OUTBOX_SEARCH_PATH=schema,  # the example's orders table lives in the test schema
    )
    run = subprocess.run(
        [sys.executable, "-m", "examples.django_outbox.app"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "order 1 placed" in run.stdout
    assert "rolled back" in run.stdout
    (row,) = store.message_claim(queues=["celery"], limits=[5], owner="test")
    assert row.headers["task"] == "examples.django_outbox.send_confirmation"
    assert json.loads(row.body)[0] == [1]


@pytest.mark.parametrize(
    "page", ["examples/migrate_from_rabbitmq.md", "docs/migrate-from-rabbitmq.md", "docs/quickstart.md"]
)
def test_the_pages_name_only_akadze_commands_and_options_that_exist(page: str) -> None:
    text = (ROOT / page).read_text(encoding="utf-8")
    code = "\n".join(re.findall(r"^```(?:sh|console)\n(.*?)^```", text, re.M | re.S))
    snippets = re.findall(r"^(?:\$ )?(?:celery -A \w+ )?(akadze [^\n#]*)", code, re.M) + re.findall(
        r"`(akadze [^`]*)`", text
    )
    used: dict[str, set[str]] = {}
    for snippet in snippets:
        command = snippet.split()[1]
        used.setdefault(command, set()).update(re.findall(r"--[a-z-]+", snippet))
    assert {"migrate"} <= used.keys()
    cli = Path(sys.executable).with_name("akadze")
    for command, flags in sorted(used.items()):
        shown = subprocess.run([cli, command, "--help"], capture_output=True, text=True, check=True).stdout
        assert flags <= set(re.findall(r"--[a-z-]+", shown)), f"`akadze {command}` lacks some of {sorted(flags)}"
