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

-- name: server_sessions
-- Client backends of the whole server (every database) against the connection limit: what a fleet
-- leaves for everyone else. Superusers may also use the reserved slots.
SELECT count(*)::int AS client_backends,
       count(*) FILTER (WHERE datname = current_database())::int AS in_this_database,
       current_setting('max_connections')::int AS max_connections,
       current_setting('superuser_reserved_connections')::int AS superuser_reserved
FROM pg_stat_activity
WHERE backend_type = 'client backend';

-- name: bare_table_create
-- The publish ceiling's table (fleet.py, workload g): the columns and indexes of akadze's messages
-- and nothing else, so the INSERT below is what a message row costs without akadze around it.
CREATE TABLE {schema}.{table} (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL,
    priority          smallint NOT NULL DEFAULT 0,
    body              bytea NOT NULL,
    content_type      text,
    content_encoding  text,
    headers           jsonb NOT NULL DEFAULT '{}'::jsonb,
    properties        jsonb NOT NULL DEFAULT '{}'::jsonb,
    state             text NOT NULL DEFAULT 'ready',
    available_at      timestamptz NOT NULL DEFAULT now(),
    run_count         integer NOT NULL DEFAULT 0,
    attempts          integer NOT NULL DEFAULT 0,
    owner             text,
    claimed_at        timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    expires_at        timestamptz
);
CREATE INDEX ON {schema}.{table} (queue, priority DESC, id) WHERE state = 'ready';
CREATE INDEX ON {schema}.{table} (owner) WHERE state = 'held';
CREATE INDEX ON {schema}.{table} (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX ON {schema}.{table} (available_at) WHERE state = 'delayed';

-- name: bare_insert
-- One message row, nothing else: the publish ceiling without a wake-up.
INSERT INTO {schema}.{table} (queue, body, content_type, content_encoding, headers, properties)
VALUES (%(queue)s, %(body)s, %(content_type)s, %(content_encoding)s, %(headers)s, %(properties)s);

-- name: bare_insert_notify
-- The same row and a NOTIFY in the same transaction (one statement, as akadze's message_insert):
-- the ceiling with a wake-up, which takes the server-wide notify lock at commit.
WITH ins AS (
    INSERT INTO {schema}.{table} (queue, body, content_type, content_encoding, headers, properties)
    VALUES (%(queue)s, %(body)s, %(content_type)s, %(content_encoding)s, %(headers)s, %(properties)s)
    RETURNING queue
)
SELECT pg_notify(%(channel)s, ins.queue) FROM ins;

-- name: table_truncate
-- Empty a table this run owns between publish rounds, so every round starts on the same empty table.
TRUNCATE {schema}.{table};

-- name: pgmq_send_topic_with_headers
-- kombu's pgmq transport publishes to fanout and topic exchanges with
-- send_topic(routing_key =>, msg =>, headers =>) (every kombu message has
-- headers); the plain-SQL install script of the pgmq wheel (PGMQ 1.13.0)
-- defines send_topic with headers only together with delay, which has no
-- default there, so that call finds no function. This overload forwards to the
-- four-argument one with no delay.
CREATE OR REPLACE FUNCTION pgmq.send_topic(routing_key text, msg jsonb, headers jsonb)
RETURNS integer LANGUAGE sql VOLATILE
AS $$ SELECT pgmq.send_topic(routing_key, msg, headers, 0) $$;

-- name: floor_claim
-- The latency floor's claim (latency_floor.py): the oldest ready row of a queue, taken as akadze's
-- claim takes it (SKIP LOCKED, state held, run counted), in one statement.
UPDATE {schema}.{table} AS m
SET state = 'held', run_count = m.run_count + 1, owner = 'floor', claimed_at = now()
WHERE m.id = (
    SELECT r.id FROM {schema}.{table} AS r
    WHERE r.queue = %(queue)s AND r.state = 'ready'
    ORDER BY r.priority DESC, r.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING m.id;

-- name: floor_round_trip
-- drain_profile.py's floor of a statement: a round trip of 7 parameters that touches no table.
SELECT %(p0)s::int, %(p1)s::int, %(p2)s::int, %(p3)s::int, %(p4)s::int, %(p5)s::int, %(p6)s::int;

-- name: floor_copy_messages
-- drain_profile.py: a queue's rows of akadze's messages table copied into the bare table, so the bare
-- statement below works on the same payloads as akadze's.
INSERT INTO {schema}.{table} (queue, body, content_type, content_encoding, headers, properties)
SELECT 'q', body, content_type, content_encoding, headers, properties
FROM {source}.messages WHERE queue = %(queue)s ORDER BY id;

-- name: floor_ack_claim
-- drain_profile.py's floor of the statement a claim needs: delete the row claimed last (fenced as an
-- ack) and claim the next (as floor_claim), returning what a delivery needs, in one statement, on the
-- columns and indexes of akadze's messages but without akadze's function around it.
WITH acked AS (
    DELETE FROM {schema}.{table} AS m
    WHERE m.id = %(ack_id)s AND m.run_count = %(ack_run_count)s AND m.state = 'held' AND m.owner = 'floor'
)
UPDATE {schema}.{table} AS m
SET state = 'held', run_count = m.run_count + 1, attempts = m.attempts + 1, owner = 'floor', claimed_at = now()
WHERE m.id = (
    SELECT r.id FROM {schema}.{table} AS r
    WHERE r.queue = 'q' AND r.state = 'ready'
    ORDER BY r.priority DESC, r.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING m.id, m.queue, m.priority, m.body, m.content_type, m.content_encoding, m.headers, m.properties,
          m.run_count, m.attempts;

-- name: floor_listen
-- The latency floor's consumer waits for wake-ups on one channel.
LISTEN {channel};
