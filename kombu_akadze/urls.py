"""Broker URLs: turning kombu's hostname into a libpq DSN, and masking passwords for display."""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"(?P<head>^[a-z][a-z0-9+.-]*://[^/@:?#]*:)(?P<secret>[^@/?#]*)(?P<tail>@)", re.I)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&#]*)", re.I)
_KV_PASSWORD = re.compile(r"(?P<head>(?:^|\s)password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.I)

EMBEDDED_SCHEMES = ("akadze://", "akadze:")


def mask_password(url: str, mask: str = "**") -> str:
    """Return *url* (libpq URL or key=value conninfo) with every password replaced by *mask*."""

    def sub(match: re.Match[str]) -> str:
        secret = match.group("secret")
        if not secret:
            return match.group(0)
        tail = match.groupdict().get("tail") or ""
        return f"{match.group('head')}{mask}{tail}"

    out = _URL_PASSWORD.sub(sub, url)
    out = _QUERY_PASSWORD.sub(sub, out)
    return _KV_PASSWORD.sub(sub, out)


def is_embedded(hostname: str | None) -> bool:
    """True when the broker URL names no server (``akadze://``): use the embedded PostgreSQL."""
    if not hostname or hostname in ("localhost",):
        return True
    return hostname.rstrip("/") in ("akadze:", "akadze:/")


def to_dsn(hostname: str) -> str:
    """kombu hands the transport the URL after ``akadze+``; libpq takes postgresql:// and postgres://."""
    if hostname.startswith(("postgresql://", "postgres://")) or "=" in hostname:
        return hostname
    raise ValueError(
        f"not a PostgreSQL URL: {mask_password(hostname)!r}; use "
        "'akadze+postgresql://user:password@host:5432/dbname' (or 'akadze://' for the embedded server)"
    )
