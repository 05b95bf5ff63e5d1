"""Loads the named SQL blocks of store/sql/*.sql once (names unique across files), and the numbered migrations."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

_NAME = re.compile(r"^-- name: (?P<name>[a-z_]+)\s*$", re.M)
_MIGRATION = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    text: str


def quote_ident(name: str) -> str:
    """Quote a PostgreSQL identifier: names are data, never SQL."""
    if not name or "\x00" in name:
        raise ValueError("an identifier must be a non-empty string without NUL characters")
    return '"' + name.replace('"', '""') + '"'


def render_migration(text: str, schema: str) -> str:
    """A migration for *schema*: ``{schema}`` as the quoted identifier, ``{schema_hex}`` as the hex digits
    of its UTF-8 name (a literal that needs no quoting, for keys that must differ between schemas)."""
    return text.replace("{schema_hex}", schema.encode("utf-8").hex()).replace("{schema}", quote_ident(schema))


@cache
def blocks(filename: str) -> dict[str, str]:
    """Every ``-- name: x`` block of one file under store/sql/, keyed by name."""
    text = resources.files("kombu_akadze.store").joinpath("sql", filename).read_text(encoding="utf-8")
    return parse_blocks(text, filename)


@cache
def all_blocks() -> dict[str, str]:
    """Every named block of every file under store/sql/ (split by subject), keyed by name."""
    found: dict[str, str] = {}
    folder = resources.files("kombu_akadze.store").joinpath("sql")
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".sql"):
            for name, body in blocks(entry.name).items():
                if name in found:
                    raise RuntimeError(f"duplicate SQL block {name!r} in {entry.name}")
                found[name] = body
    return found


def parse_blocks(text: str, filename: str = "<sql>") -> dict[str, str]:
    """The ``-- name: x`` blocks of one SQL text (also used by tests and benchmarks for their own files)."""
    found: dict[str, str] = {}
    matches = list(_NAME.finditer(text))
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end() : end].strip()
        if match["name"] in found:
            raise RuntimeError(f"duplicate SQL block {match['name']!r} in {filename}")
        found[match["name"]] = body
    return found


@cache
def render(name: str, **identifiers: str) -> str:
    """Block *name* (of whichever file under store/sql/ holds it) with each ``{identifier}`` quoted; kept
    per (name, identifiers), as every statement renders its block again (a publish: ~4 us of ~120)."""
    text = all_blocks()[name]
    for key, value in identifiers.items():
        text = text.replace("{" + key + "}", quote_ident(value))
    return text


@cache
def migrations() -> tuple[Migration, ...]:
    """All migrations shipped with this package, oldest first."""
    folder = resources.files("kombu_akadze.store").joinpath("sql", "migrations")
    found = []
    for entry in folder.iterdir():
        match = _MIGRATION.match(entry.name)
        if match:
            found.append(Migration(int(match["version"]), match["name"], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    for expected, migration in enumerate(found, start=1):
        if migration.version != expected:
            raise RuntimeError(f"migrations must be numbered 1..n without gaps; found {migration.version}")
    return tuple(found)
