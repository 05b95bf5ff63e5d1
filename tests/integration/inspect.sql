-- name: columns
-- Every column of one schema's tables, in table and column order.
SELECT table_name, column_name, data_type, is_nullable, column_default
FROM information_schema.columns WHERE table_schema = %(schema)s
ORDER BY table_name, ordinal_position;

-- name: indexes
-- Every index of one schema, its definition with the schema name left out.
SELECT indexname, replace(replace(indexdef, %(quoted)s || '.', 'SCHEMA.'), %(schema)s || '.', 'SCHEMA.')
FROM pg_indexes WHERE schemaname = %(schema)s ORDER BY indexname;

-- name: version_insert
-- Pretend a newer kombu-akadze migrated this schema.
INSERT INTO {schema}.schema_version (version, name) VALUES (99, 'future');

-- name: analyze_messages
-- Fresh planner statistics for the messages table.
ANALYZE {schema}.messages;

-- name: consumer_count
-- How many consumers are registered (alive or not yet rescued).
SELECT count(*) FROM {schema}.consumers;

-- name: prepared_count
-- How many statements this session has prepared server-side.
SELECT count(*) FROM pg_prepared_statements;

-- name: prepared_plans
-- This session's prepared statements whose text starts with %(prefix)s: generic and custom plans run.
SELECT COALESCE(sum(generic_plans), 0) AS generic, COALESCE(sum(custom_plans), 0) AS custom
FROM pg_prepared_statements WHERE statement LIKE %(prefix)s || '%%';

-- name: vacuum_messages
-- What autovacuum does to a drained queue table: dead rows gone, the empty heap truncated.
VACUUM {schema}.messages;

-- name: lock_messages_as_writer
-- The lock every claim, ack and publish holds until its transaction ends.
LOCK TABLE {schema}.messages IN ROW EXCLUSIVE MODE;

-- name: messages_count
-- Rows of every state in the messages table.
SELECT count(*) FROM {schema}.messages;

-- name: lock_messages_exclusive
-- A lock every statement on the table waits for, claims included, until this transaction ends.
LOCK TABLE {schema}.messages IN ACCESS EXCLUSIVE MODE;

-- name: terminate_sessions
-- End the backends of sessions whose application_name is %(name)s; how many were ended. The pids are
-- picked first (MATERIALIZED): with the filter and the call in one WHERE the planner may call
-- pg_terminate_backend on rows the filter would have dropped, this session's own included.
WITH picked AS MATERIALIZED (
    SELECT pid FROM pg_stat_activity WHERE application_name = %(name)s AND pid <> pg_backend_pid()
)
SELECT count(*) AS ended FROM picked WHERE pg_terminate_backend(pid, 5000);
