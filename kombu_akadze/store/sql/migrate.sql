-- name: migrate_lock
-- Serialise migrations of one schema across processes; released at commit.
SELECT pg_advisory_xact_lock(hashtext('kombu_akadze:' || %(schema)s));

-- name: schema_create
-- The schema that holds every kombu-akadze table.
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: version_table_create
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS {schema}.schema_version (
    version     integer PRIMARY KEY,
    name        text NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now()
);

-- name: version_table_exists
-- Whether the version table exists (without creating anything).
SELECT to_regclass(%(table)s) IS NOT NULL AS present;

-- name: version_list
-- Applied migrations, oldest first.
SELECT version, name, applied_at FROM {schema}.schema_version ORDER BY version;

-- name: version_record
-- Mark one migration applied.
INSERT INTO {schema}.schema_version (version, name) VALUES (%(version)s, %(name)s)

-- name: schema_drop
-- Remove a schema and everything in it (tests and `akadze uninstall`-style cleanup only).
DROP SCHEMA IF EXISTS {schema} CASCADE;
