"""The one exception hierarchy of kombu-akadze; psycopg errors are translated into it by kombu_akadze.store."""

from __future__ import annotations


class AkadzeError(Exception):
    """Base class of every error kombu-akadze raises on purpose."""


class ConfigurationError(AkadzeError, ValueError):
    """A transport option or URL is not valid; the message says what is."""


class DatabaseError(AkadzeError):
    """The database refused a statement for a reason that retrying will not fix."""


class TransientDatabaseError(DatabaseError, ConnectionError):
    """Lost connection, restart, failover, too many connections, deadlock or
    serialization failure: safe to retry with backoff (kombu reconnects)."""


class PermanentConnectionError(DatabaseError):
    """The server refused the connection for a reason only a change of configuration fixes: a wrong
    password, a role or database that does not exist, no pg_hba.conf entry. Deliberately not a
    ConnectionError, so kombu and Celery fail at once instead of retrying for minutes; the message
    says what to fix."""


class PermissionDeniedError(DatabaseError):
    """The role may not run this statement (e.g. REINDEX needs the table's owner)."""


class SchemaError(DatabaseError):
    """The database schema is missing or newer than this package knows."""


class SchemaNotAppliedError(SchemaError):
    """Migrations are pending and auto_migrate is off."""


class SchemaTooNewError(SchemaError):
    """The schema was migrated by a newer kombu-akadze."""


class MessageTooLargeError(AkadzeError, ValueError):
    """A message body is larger than the max_message_size transport option."""


class QueueFullError(AkadzeError):
    """The queue is at its x-max-length and its x-overflow is reject-publish."""
