-- Every statement the benchmark itself runs against PostgreSQL, as named blocks.
-- {schema} and {table} are replaced by quoted identifiers; %(x)s are parameters.

-- name: schema_create
-- A private schema for kombu's sqla transport (its tables, sequences and index names are fixed).
CREATE SCHEMA IF NOT EXISTS {schema};

-- name: schema_drop
-- Remove a schema this run created, with everything in it.
DROP SCHEMA IF EXISTS {schema} CASCADE;

-- name: statements_available
-- Whether pg_stat_statements is both installed here and loaded by the server.
SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'pg_stat_statements')
       AND current_setting('shared_preload_libraries') LIKE '%%pg_stat_statements%%' AS available;

-- name: statements_calls
-- Statements executed so far in this database (pg_stat_statements, all users).
SELECT COALESCE(sum(s.calls), 0)::bigint AS calls
FROM pg_stat_statements AS s
JOIN pg_database AS d ON d.oid = s.dbid
WHERE d.datname = current_database();

-- name: database_transactions
-- Committed and rolled back transactions of this database; autocommit sessions commit once per statement.
SELECT xact_commit::bigint AS xact_commit, xact_rollback::bigint AS xact_rollback
FROM pg_stat_database
WHERE datname = current_database();

-- name: stats_flush
-- Publish this session's pending counters now, so its own sampling queries land before the next sample.
SELECT pg_stat_force_next_flush();

-- name: client_sessions
-- Other client sessions on this database, by application_name (who else would be counted).
SELECT COALESCE(NULLIF(application_name, ''), '(no application_name)') AS application_name, count(*)::int AS sessions
FROM pg_stat_activity
WHERE datname = current_database()
  AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
GROUP BY 1
ORDER BY 1;

-- name: relation_sizes
-- Heap, index and total bytes of one table, and its live and dead tuple estimates.
SELECT pg_total_relation_size(c.oid)::bigint AS total_bytes,
       pg_relation_size(c.oid)::bigint AS heap_bytes,
       pg_indexes_size(c.oid)::bigint AS index_bytes,
       COALESCE(s.n_live_tup, 0)::bigint AS live_tuples,
       COALESCE(s.n_dead_tup, 0)::bigint AS dead_tuples
FROM pg_class AS c
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = %(table)s::regclass;

-- name: table_vacuum
-- Plain VACUUM (what autovacuum does), not VACUUM FULL: shows what space comes back without a rewrite.
VACUUM {schema}.{table};

-- name: table_analyze
-- Fresh planner statistics after a bulk load.
ANALYZE {schema}.{table};

-- name: server_version
-- For the results header.
SELECT current_setting('server_version') AS version;

-- name: server_settings
-- The settings that change these figures most, for the results header.
SELECT name, setting, unit FROM pg_settings
WHERE name IN ('autovacuum', 'fsync', 'full_page_writes', 'max_connections', 'shared_buffers',
               'synchronous_commit', 'wal_sync_method')
ORDER BY name;

-- name: database_create
-- A scratch database for the idle-cost workload, so no other client's work lands in its counters.
CREATE DATABASE {database};

-- name: database_drop
-- Drop the scratch database, ending any session still in it.
DROP DATABASE IF EXISTS {database} WITH (FORCE);
