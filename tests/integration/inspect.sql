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

-- name: prepared_claim
-- Name of this session's prepared message_ack_claim (psycopg prepares it after its fifth run).
SELECT name FROM pg_prepared_statements WHERE statement LIKE '-- The hot path in one round trip%%';

-- name: explain_prepared_claim
-- What this session's prepared claim reads to claim one message of queue 'q' (functions included).
-- Parameters in order of first use: durable, ack_ids, ack_run_counts, owner, queues, limits, now, park.
EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE {statement}(false, '{}', '{}', 'plan-probe', '{q}', '{1}', NULL, NULL);

-- name: auto_explain_load
-- The server's auto_explain module in this session (superuser; contrib).
LOAD 'auto_explain';

-- name: auto_explain_nested
-- Every statement of this session, functions' own queries included, has its plan sent to the client.
SELECT set_config('auto_explain.log_min_duration', '0', false),
       set_config('auto_explain.log_nested_statements', 'on', false),
       set_config('auto_explain.log_level', 'notice', false),
       set_config('client_min_messages', 'notice', false);

-- name: loop_claim_plans
-- How this session's event-loop ack+claim statement has been planned: (generic, custom) plan counts.
SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = 'akadze_ack_claim';

-- name: forget_claim
-- Undo the claim of message %(id)s as a server that lost it would (a failover to an asynchronous
-- standby that never got the claim's WAL): ready again, run_count and attempts as before the claim.
UPDATE {schema}.messages
SET state = 'ready', owner = NULL, claimed_at = NULL, run_count = run_count - 1, attempts = attempts - 1
WHERE id = %(id)s AND state = 'held';

-- name: claim_in_transaction
-- The claim function as a consumer's claim statement runs it, inside a transaction the test holds open.
SELECT id, run_count FROM {schema}.claim(ARRAY[%(queue)s]::text[], ARRAY[1], %(owner)s, NULL);

-- name: lock_waiters
-- Sessions of one application_name waiting for a lock right now.
SELECT count(*) AS n FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
WHERE NOT l.granted AND a.application_name = %(application_name)s;

-- name: ack_function_drop
-- Break the ack path of one schema as a half-applied downgrade would: every ack then fails with
-- undefined_function (42883), an error no retry fixes, while claims already made stay held.
DROP FUNCTION {schema}.ack(bigint[], integer[], text);

-- name: messages_lock
-- Hold every row of the messages table (in the caller's transaction): fenced writes to them wait.
SELECT id FROM {schema}.messages ORDER BY id FOR UPDATE;

-- name: waiting_cancel
-- Cancel (query_canceled, 57014: transient) the statements on this schema that wait for a lock.
SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'
  AND strpos(query, %(quoted)s) > 0;

-- name: timeouts_show
-- The lock and statement timeouts of this session, as PostgreSQL shows them.
SELECT current_setting('lock_timeout'), current_setting('statement_timeout');

-- name: waiting_rows
-- Who is parked on which queue, longest first.
SELECT queue, consumer FROM {schema}.waiting ORDER BY since, consumer;


-- name: wake_call
-- The wake function as the publish statements call it: how many consumers it woke.
SELECT {schema}.wake(%(queues)s::text[]) AS woken;

-- name: insert_without_wake
-- A ready row written as by hand: no wake-up for anyone (a lost one, as far as consumers can tell).
INSERT INTO {schema}.messages (queue, body, content_type, content_encoding, properties)
VALUES (%(queue)s, %(body)s, 'application/json', 'utf-8',
        '{"delivery_info": {"exchange": "", "routing_key": "lost"}, "delivery_mode": 2}'::jsonb);

-- name: backends_alive
-- How many of these backend pids are live sessions on the server.
SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%(pids)s);

-- name: listening_channels
-- The channels this session LISTENs on.
SELECT c FROM pg_listening_channels() AS c ORDER BY c;

-- name: previous_ack_claim
-- message_ack_claim as the release before migration 0011 sent it (ack, then claim_park): workers of that
-- release keep running against the migrated schema during a rolling upgrade.
WITH acked AS (
    SELECT a.id FROM {schema}.ack(%(ack_ids)s::bigint[], %(ack_run_counts)s::integer[], %(owner)s::text) AS a(id)
), claimed AS (
    SELECT c.id, c.queue, c.body, c.run_count
    FROM {schema}.claim_park(%(queues)s::text[], %(limits)s::integer[], %(owner)s::text, NULL, %(park)s::text) AS c
)
SELECT claimed.id, claimed.queue, claimed.body, claimed.run_count, CASE WHEN claimed.id IS NULL THEN 'retry' ELSE 'claimed' END AS kind
FROM claimed
UNION ALL
SELECT acked.id, NULL, NULL, NULL, 'acked' FROM acked;

-- name: messages_expiring
-- How many of a queue's messages carry an expiry (message or queue TTL applied at publish).
SELECT count(*) FILTER (WHERE expires_at IS NOT NULL) AS expiring, count(*) AS total
FROM {schema}.messages WHERE queue = %(queue)s;

-- name: function_settings
-- The settings each function of a schema runs with (ALTER FUNCTION ... SET, or SET in its definition).
SELECT p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')' AS function, p.proconfig AS settings
FROM pg_proc AS p WHERE p.pronamespace = %(schema)s::regnamespace ORDER BY 1;

-- name: database_create
-- A database of a test's own.
CREATE DATABASE {database};

-- name: database_drop
-- Gone with its sessions.
DROP DATABASE IF EXISTS {database} WITH (FORCE);

-- name: prepared_names
-- The names of the statements this session has prepared server-side.
SELECT name FROM pg_prepared_statements ORDER BY name;

-- name: prepared_drop_all
-- Forget every statement this session prepared, behind the store's back.
DEALLOCATE ALL;

-- name: message_expires_in
-- Seconds from a message's creation to its expiry (NULL: it never expires), and its state.
SELECT extract(epoch FROM expires_at - created_at)::float8 AS ttl, state FROM {schema}.messages WHERE id = %(id)s;

-- name: park_unheard
-- A consumer parked with slots on a channel nobody LISTENs on: what a publish hands it is held under its
-- id and the notification is lost (a LISTEN session or relay link gone between the park and the publish).
INSERT INTO {schema}.waiting (queue, consumer, channel, slots)
VALUES (%(queue)s, %(consumer)s, 'akadze.nobody-listens', %(slots)s)
ON CONFLICT (queue, consumer) DO UPDATE SET channel = EXCLUDED.channel, slots = EXCLUDED.slots;

-- name: terminate_pid
-- End one backend (a session the test found the pid of); whether it was signalled.
SELECT pg_terminate_backend(%(pid)s);

-- name: message_hold_for
-- A message held under a consumer's id that its transport does not know of (as a lost claim reply).
UPDATE {schema}.messages
SET state = 'held', owner = %(owner)s, run_count = run_count + 1, attempts = attempts + 1, claimed_at = now()
WHERE id = %(id)s;

-- name: message_lock
-- Lock one message's row (inside the caller's transaction): a write to it waits until the commit.
SELECT id FROM {schema}.messages WHERE id = %(id)s FOR UPDATE;

-- name: consumer_exists
-- Whether a consumer's row is there.
SELECT count(*) FROM {schema}.consumers WHERE id = %(id)s;

-- name: index_scans_in_transaction
-- Index scans of the messages table so far in this transaction, by index: how a statement found its rows.
SELECT pg_stat_get_xact_numscans(format('%%I.messages_held_idx', %(schema)s::text)::regclass) AS held_idx,
       pg_stat_get_xact_numscans(format('%%I.messages_pkey', %(schema)s::text)::regclass) AS pkey;

-- name: generic_plans_in_transaction
-- Plan every prepared statement generically for the rest of this transaction, as a plan cache may.
SET LOCAL plan_cache_mode = force_generic_plan;
