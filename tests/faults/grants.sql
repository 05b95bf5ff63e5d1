-- Least privilege for kombu-akadze: the migrations run as an owner role; workers and producers
-- run as an application role that can read and write the rows of the schema's tables, nothing more
-- (no DDL, no TRUNCATE, no other schema). See docs/operations.md, "Least privilege".
--
-- {schema}: the kombu-akadze schema (transport option `schema`, default akadze)
-- {owner}:  the role that runs `akadze migrate` (owns the schema and its tables)
-- {role}:   the role in the workers' and producers' broker URL (auto_migrate=False)
-- {database}: the database holding the schema
-- Each block is run by the owner (or a superuser), after the migrations.

-- name: grant_owner
-- The owner may create the schema in the database (once, before the first `akadze migrate`).
GRANT CONNECT, CREATE ON DATABASE {database} TO {owner};

-- name: grant_app
-- Run-time rights of workers and producers on what exists now: reach the schema; read and write
-- rows (claim and outcomes are UPDATE/DELETE, publishes INSERT, the version check SELECT); draw
-- message ids from the identity sequence. LISTEN/NOTIFY needs no grant.
GRANT CONNECT ON DATABASE {database} TO {role};
GRANT USAGE ON SCHEMA {schema} TO {role};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {role};

-- name: grant_app_future
-- The same rights on tables and sequences that later migrations (run by the owner) create, so an
-- upgrade needs no new GRANT.
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema}
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema}
    GRANT USAGE, SELECT ON SEQUENCES TO {role};

-- name: revoke_app
-- Take it all back (the role can then be dropped).
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema}
    REVOKE SELECT, INSERT, UPDATE, DELETE ON TABLES FROM {role};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema}
    REVOKE USAGE, SELECT ON SEQUENCES FROM {role};
REVOKE ALL ON ALL SEQUENCES IN SCHEMA {schema} FROM {role};
REVOKE ALL ON ALL TABLES IN SCHEMA {schema} FROM {role};
REVOKE USAGE ON SCHEMA {schema} FROM {role};
REVOKE CONNECT ON DATABASE {database} FROM {role};
