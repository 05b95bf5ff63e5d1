"""Prometheus text exposition of queue depth, oldest-ready age, live consumers and dead letters; a stdlib server."""

from __future__ import annotations

import logging
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING

from kombu_akadze.errors import AkadzeError
from kombu_akadze.ops import stats

if TYPE_CHECKING:
    from kombu_akadze.store import StatsSnapshot, Store

logger = logging.getLogger("kombu_akadze")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
STATES = ("ready", "held", "delayed")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(store: Store, *, ttl: float = stats.DEFAULT_CONSUMER_TTL) -> str:
    """The current metrics of the store's schema in the Prometheus text format."""
    return render_snapshot(stats.snapshot(store, ttl=ttl))


def render_snapshot(snap: StatsSnapshot) -> str:
    lines = [
        "# HELP akadze_queue_messages Messages per queue and state (delayed: ready later).",
        "# TYPE akadze_queue_messages gauge",
    ]
    for q in snap.queues:
        counts = {"ready": q.ready, "held": q.held, "delayed": q.delayed}
        lines.extend(
            f'akadze_queue_messages{{queue="{_label(q.queue)}",state="{state}"}} {counts[state]}' for state in STATES
        )
    lines += [
        "# HELP akadze_queue_oldest_ready_seconds Seconds the oldest ready message has been claimable (0: none).",
        "# TYPE akadze_queue_oldest_ready_seconds gauge",
    ]
    lines.extend(
        f'akadze_queue_oldest_ready_seconds{{queue="{_label(q.queue)}"}} {q.oldest_ready_age_seconds or 0.0:.3f}'
        for q in snap.queues
    )
    lines += [
        "# HELP akadze_consumers_alive Consumers whose heartbeat is within the TTL.",
        "# TYPE akadze_consumers_alive gauge",
        f"akadze_consumers_alive {snap.consumers_alive}",
        "# HELP akadze_dead_letters Dead letters per queue.",
        "# TYPE akadze_dead_letters gauge",
    ]
    lines.extend(f'akadze_dead_letters{{queue="{_label(q.queue)}"}} {q.dead}' for q in snap.queues)
    return "\n".join(lines) + "\n"


def make_server(
    store: Store, *, host: str = "127.0.0.1", port: int = 9808, ttl: float = stats.DEFAULT_CONSUMER_TTL
) -> ThreadingHTTPServer:
    """An HTTP server answering GET /metrics (and /); the caller runs serve_forever() and server_close()."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] not in ("/", "/metrics"):
                self._reply(404, "not found: try /metrics\n")
                return
            try:
                body = render(store, ttl=ttl)
            except AkadzeError as exc:  # the database is down: say so, keep serving
                logger.warning("kombu-akadze metrics: %s", exc)
                self._reply(503, f"# akadze metrics unavailable: {exc}\n")
                return
            self._reply(200, body)

        def _reply(self, code: int, text: str) -> None:
            data = text.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            logger.debug("kombu-akadze metrics: " + format, *args)

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    return server
