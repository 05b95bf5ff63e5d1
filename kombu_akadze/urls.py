"""Broker URLs: turning kombu's connection parameters into a libpq DSN, and masking passwords for display."""

from __future__ import annotations

import logging
import os
import re
import ssl as _ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

logger = logging.getLogger("kombu_akadze")

_URL_PASSWORD = re.compile(r"(?P<head>^[a-z][a-z0-9+.-]*://[^/@:?#]*:)(?P<secret>[^@/?#]*)(?P<tail>@)", re.I)
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)(?P<secret>[^&#]*)", re.I)
_KV_PASSWORD = re.compile(r"(?P<head>(?:^|\s)password\s*=\s*)(?P<secret>'(?:[^'\\]|\\.)*'|\S+)", re.I)

EMBEDDED_SCHEMES = ("akadze://", "akadze:")
#: Schemes kombu hands over whole (can_parse_url) or after the ``akadze+`` prefix; akadze:// is kombu-native.
_PG_SCHEMES = ("postgresql://", "postgres://")
_NATIVE = "akadze://"


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
    """A libpq DSN from a whole URL: ``akadze://…``, ``akadze+postgresql://…``, ``postgresql://…`` or a
    key=value conninfo string."""
    if hostname.startswith("akadze+"):
        hostname = hostname[len("akadze+") :]
    if hostname.startswith(_NATIVE):
        return require_database("postgresql://" + hostname[len(_NATIVE) :])
    if hostname.startswith(_PG_SCHEMES) or "=" in hostname:
        return require_database(hostname)
    raise ValueError(
        f"not a PostgreSQL URL: {mask_password(hostname)!r}; use 'akadze://user:password@host:5432/dbname' "
        "or 'akadze+postgresql://user:password@host:5432/dbname' (or 'akadze://' for the embedded server)"
    )


_KV_PAIR = re.compile(r"(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S*)")


def database_of(dsn: str) -> str | None:
    """The database a libpq URL or key=value conninfo names (``dbname``, or a ``service`` that may);
    None when it names none and libpq would fall back to PGDATABASE or the user's name."""
    if dsn.startswith(_PG_SCHEMES):
        split = urlsplit(dsn)
        query = dict(parse_qsl(split.query, keep_blank_values=True))
        named = query.get("dbname") or query.get("service") or unquote(split.path.lstrip("/"))
    else:
        pairs = {key: value.strip("'") for key, value in _KV_PAIR.findall(dsn)}
        named = pairs.get("dbname") or pairs.get("service") or ""
    return named or None


def require_database(dsn: str) -> str:
    """*dsn*, if it names a database (or PGDATABASE does). Without one, libpq would connect to the
    database named after the user and the migrations would create the schema there, unnoticed."""
    if database_of(dsn) is None and not os.environ.get("PGDATABASE"):
        raise ValueError(
            f"the URL {mask_password(dsn)!r} names no database: libpq would use the database named after "
            "the user, and kombu-akadze would create its tables there. Name the database after the last "
            "'/': 'akadze+postgresql://user:password@host:5432/dbname' (key=value form: dbname=...; or set PGDATABASE)"
        )
    return dsn


@dataclass(frozen=True)
class Parts:
    """What kombu's Connection keeps of a broker URL (hostname, port, userid, password, virtual_host)."""

    hostname: str
    port: int | None = None
    userid: str | None = None
    password: str | None = None
    virtual_host: str | None = None


def kombu_parts(url: str) -> Parts | None:
    """The parts of an ``akadze://`` URL naming one server and no libpq options, as kombu's parse_url
    gives them for amqp://; None for anything kombu's attributes cannot carry whole (query options,
    libpq multi-host lists, conninfo strings, the embedded server)."""
    if not url.startswith(_NATIVE) or is_embedded(url):
        return None
    split = urlsplit("http://" + url[len(_NATIVE) :])
    if split.query or split.fragment or "," in split.netloc or not split.hostname:
        return None
    try:
        port = split.port
    except ValueError:
        return None
    database = split.path[1:] if split.path.startswith("/") else split.path
    return Parts(
        unquote(split.hostname),
        port,
        unquote(split.username or "") or None,
        unquote(split.password or "") or None,
        unquote(database) or None,
    )


def dsn_of_parts(parts: Parts) -> str:
    """A libpq URL from kombu's connection attributes (what Connection.switch() leaves after failover)."""
    host = parts.hostname
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    auth = ""
    if parts.userid:
        auth = quote(parts.userid, safe="")
        if parts.password:
            auth += ":" + quote(parts.password, safe="")
        auth += "@"
    port = f":{parts.port}" if parts.port else ""
    database = quote(parts.virtual_host or "", safe="")
    return f"postgresql://{auth}{host}{port}/{database}"


#: kombu's ssl dict keys (as py-amqp and redis name them, with or without ``ssl_``) -> libpq settings.
_SSL_FILES = {"ca_certs": "sslrootcert", "certfile": "sslcert", "keyfile": "sslkey"}
_LIBPQ_SSL = frozenset(["sslmode", "sslrootcert", "sslcert", "sslkey", "sslpassword", "sslcrl", "sslcrldir", "sslsni"])
_CERT_REQS = {
    _ssl.CERT_NONE: "require",
    _ssl.CERT_OPTIONAL: "verify-ca",
    _ssl.CERT_REQUIRED: "verify-full",
    "none": "require",
    "cert_none": "require",
    "optional": "verify-ca",
    "cert_optional": "verify-ca",
    "required": "verify-full",
    "cert_required": "verify-full",
}


def libpq_ssl(ssl: Any) -> dict[str, str]:
    """Celery's ``broker_use_ssl`` (kombu's Connection(ssl=...)) as libpq TLS settings.

    True: ``sslmode=require``. A dict: ``ca_certs``/``certfile``/``keyfile`` -> ``sslrootcert``/
    ``sslcert``/``sslkey``; ``cert_reqs`` CERT_NONE -> require, CERT_OPTIONAL -> verify-ca,
    CERT_REQUIRED -> verify-full (verify-ca with ``check_hostname=False``); without ``cert_reqs``,
    verify-full when a CA is given, else require. libpq's own keys (``sslmode``...) pass as they are.
    """
    if not ssl:
        return {}
    if not isinstance(ssl, dict):
        return {"sslmode": "require"}
    out: dict[str, str] = {}
    cert_reqs: Any = None
    check_hostname = True
    for raw_key, value in ssl.items():
        key = (
            raw_key[4:]
            if raw_key.startswith("ssl_") and raw_key[4:] in (*_SSL_FILES, "cert_reqs", "check_hostname")
            else raw_key
        )
        if key in _SSL_FILES:
            out[_SSL_FILES[key]] = str(value)
        elif key == "cert_reqs":
            cert_reqs = value
        elif key == "check_hostname":
            check_hostname = bool(value)
        elif key in _LIBPQ_SSL:
            out[key] = str(value)
        else:
            logger.warning("kombu-akadze: ssl option %r has no libpq equivalent and is ignored", raw_key)
    if "sslmode" not in out:
        out["sslmode"] = _sslmode(cert_reqs, check_hostname=check_hostname, has_ca="sslrootcert" in out)
    return out


def _sslmode(cert_reqs: Any, *, check_hostname: bool, has_ca: bool) -> str:
    if cert_reqs is None:
        mode = "verify-full" if has_ca else "require"
    else:
        mode = _CERT_REQS.get(cert_reqs.lower() if isinstance(cert_reqs, str) else cert_reqs, "")
        if not mode:
            raise ValueError(f"ssl cert_reqs {cert_reqs!r}: use ssl.CERT_NONE, CERT_OPTIONAL or CERT_REQUIRED")
    return "verify-ca" if mode == "verify-full" and not check_hostname else mode


def with_options(dsn: str, options: dict[str, str]) -> str:
    """*dsn* with *options* added where it does not set them already (the URL's own settings win)."""
    if not options:
        return dsn
    if dsn.startswith(_PG_SCHEMES):
        base, _, query = dsn.partition("?")
        present = {k for k, _ in parse_qsl(query, keep_blank_values=True)}
        extra = {k: v for k, v in options.items() if k not in present}
        if not extra:
            return dsn
        return f"{base}?{query + '&' if query else ''}{urlencode(extra)}"
    present = set(re.findall(r"(?:^|\s)(\w+)\s*=", dsn))
    quoted = " ".join(f"{k}='{_kv_escape(v)}'" for k, v in options.items() if k not in present)
    return f"{dsn} {quoted}".strip()


def _kv_escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("'", "\\'")


def adopt_parts(client: Any) -> None:
    """Give kombu's Connection the attributes amqp:// gives it (hostname, port, userid, password,
    virtual_host = database) for an ``akadze://`` URL it kept whole (the transport parses its URLs, so
    that libpq options may ride in the query): ``conn.hostname`` then says where it is, as after a
    failover switch(). A URL whose query, host list or form kombu's attributes cannot carry stays whole."""
    hostname = client.hostname or ""
    parts = kombu_parts(hostname)
    if parts is not None:
        client.hostname = parts.hostname
        for name in ("port", "userid", "password", "virtual_host"):
            if getattr(parts, name) is not None:  # as kombu: the URL's parts win over keyword arguments
                setattr(client, name, getattr(parts, name))
    if client.hostname and "://" not in client.hostname:
        client.uri_prefix = None  # kombu would show (and clone) a plain host as "akadze+host"


def dsn_for(client: Any) -> str | None:
    """The libpq DSN of a kombu Connection (None: the embedded server), with its ``ssl`` applied."""
    hostname: str = client.hostname or ""
    database = client.virtual_host if client.virtual_host not in (None, "", "/") else None
    if hostname.startswith(("akadze", *_PG_SCHEMES)) or "=" in hostname:
        if is_embedded(hostname):
            return None
        dsn = to_dsn(hostname)
    elif is_embedded(hostname) and not (client.userid or client.port or database):
        return None
    else:
        dsn = require_database(dsn_of_parts(Parts(hostname, client.port, client.userid, _password(client), database)))
    return with_options(dsn, libpq_ssl(client.ssl))


def listen_dsn(url: str, ssl: Any = None) -> str:
    """The libpq DSN of the transport option listen_url (any form of a broker URL naming a server), with
    *ssl* (Celery's broker_use_ssl) applied where the URL sets no TLS setting of its own."""
    if is_embedded(url):
        raise ValueError(
            f"transport option listen_url={mask_password(url)!r} names no server: give PostgreSQL itself, "
            "the server the broker URL reaches, e.g. 'postgresql://user@db:5432/dbname'"
        )
    try:
        dsn = to_dsn(url)
    except ValueError as exc:
        raise ValueError(f"transport option listen_url: {exc}") from None
    return with_options(dsn, libpq_ssl(ssl))


def display_uri(client: Any, *, include_password: bool = False, mask: str = "**") -> str:
    """``conn.as_uri()``: the URL as given (password masked), or ``akadze://`` from kombu's attributes."""
    hostname: str = client.hostname or ""
    if "://" in hostname or "=" in hostname:
        shown = hostname if include_password else mask_password(hostname, mask)
        return shown if shown.startswith("akadze") else f"akadze+{shown}"
    database = client.virtual_host if client.virtual_host not in (None, "", "/") else None
    password = _password(client)
    hidden = bool(password) and not include_password
    url = dsn_of_parts(Parts(hostname, client.port, client.userid, "\x00" if hidden else password, database))
    return _NATIVE + url[len("postgresql://") :].replace("%00", mask)


def _password(client: Any) -> str | None:
    password = client.password
    return str(password()) if callable(password) else password
