-- Statements the fault tests run besides kombu-akadze's own: server sessions, inspection, roles.
-- {schema}, {role}, {owner} are quoted identifiers substituted by the tests.

-- name: sessions
-- Backends whose application_name starts with a prefix (kombu-akadze names its sessions by role).
SELECT pid FROM pg_stat_activity
WHERE application_name LIKE %(prefix)s || '%%' AND pid <> pg_backend_pid()
ORDER BY pid;

-- name: terminate
-- End those backends, waiting up to 5 s for each to exit; the pids that were ended.
SELECT pid FROM pg_stat_activity
WHERE application_name LIKE %(prefix)s || '%%' AND pid <> pg_backend_pid()
  AND pg_terminate_backend(pid, 5000);

-- name: terminate_pid
-- End one backend, waiting up to 5 s for it to exit.
SELECT pg_terminate_backend(%(pid)s, 5000);

-- name: held_by
-- Ids of the messages held by consumers whose id contains a marker (hostname:pid:).
SELECT id FROM {schema}.messages WHERE state = 'held' AND owner LIKE '%%' || %(marker)s || '%%' ORDER BY id;

-- name: held
-- Ids of every held message (in flight at some consumer).
SELECT id FROM {schema}.messages WHERE state = 'held' ORDER BY id;

-- name: message_rows
-- Every message row of one queue, for the state machine's invariants.
SELECT id, state, owner, run_count, attempts FROM {schema}.messages WHERE queue = %(queue)s ORDER BY id;

-- name: dead_rows
-- Every dead letter of one queue, for the state machine's invariants.
SELECT id, reason, run_count, attempts FROM {schema}.dead_letters WHERE queue = %(queue)s ORDER BY id;

-- name: consumer_rows
-- Registered consumers and their last heartbeat.
SELECT id, heartbeat_at FROM {schema}.consumers ORDER BY id;

-- name: wipe
-- Empty the schema's tables between state-machine examples.
TRUNCATE {schema}.messages, {schema}.dead_letters, {schema}.consumers, {schema}.queues;

-- name: role_create
-- A login role with no privileges of its own (trust auth on the throwaway server: no password).
CREATE ROLE {role} LOGIN;

-- name: database_now
-- The database clock, which every lease computation uses.
SELECT now();

-- name: future_table_create
-- A table a later migration might add (run as the owner).
CREATE TABLE {schema}.future_table (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, note text);

-- name: future_table_insert
-- The application role writing to it (default privileges at work).
INSERT INTO {schema}.future_table (note) VALUES ('written by the application role') RETURNING id;

-- name: ddl_probe
-- DDL the application role must not be able to run.
CREATE TABLE {schema}.intruder (id integer);

-- name: truncate_probe
-- Nor may it empty a table wholesale.
TRUNCATE {schema}.messages;

-- name: sync_standby_set
-- Commits wait until the named standby has flushed them (run on the primary, then reload).
ALTER SYSTEM SET synchronous_standby_names = 'standby1';

-- name: reload
-- Re-read the configuration files.
SELECT pg_reload_conf();

-- name: replication_state
-- The standbys streaming from this server, and whether each is synchronous.
SELECT application_name, state, sync_state FROM pg_stat_replication ORDER BY application_name;

-- name: in_recovery
-- True on a standby.
SELECT pg_is_in_recovery();

-- name: read_only_on
-- Every transaction read-only from now on (with a reload: sessions already open too), as a
-- database whose disk filled up and was set read-only by its operator would be.
ALTER SYSTEM SET default_transaction_read_only = on;

-- name: read_only_off
-- Writable again (with a reload).
ALTER SYSTEM RESET default_transaction_read_only;

-- name: read_only_show
-- What a new session gets.
SHOW default_transaction_read_only;

-- name: tablespace_create
-- A tablespace in a directory of the test's (a small tmpfs); {location} is a quoted literal.
CREATE TABLESPACE {tablespace} LOCATION {location};

-- name: messages_move
-- The messages table (and its TOAST table, where large bodies live) into that tablespace.
ALTER TABLE {schema}.messages SET TABLESPACE {tablespace};

-- name: tablespace_drop
-- Gone again, so its directory can be unmounted.
DROP TABLESPACE {tablespace};

-- name: schemas_present
-- How many of the given schemas exist.
SELECT count(*) FROM pg_namespace WHERE nspname = ANY(%(names)s);

-- name: role_create_with_password
-- A login role with a password ({password} is a quoted literal).
CREATE ROLE {role} LOGIN PASSWORD {password};

-- name: role_login
-- Let a role log in again.
ALTER ROLE {role} WITH LOGIN;

-- name: role_nologin
-- Refuse new logins of a role (its open sessions are not ended by this).
ALTER ROLE {role} WITH NOLOGIN;

-- name: vacuum_stats
-- Dead rows of the messages table and when it was last vacuumed by hand (not by autovacuum).
SELECT n_dead_tup, last_vacuum FROM pg_stat_user_tables WHERE schemaname = %(schema)s AND relname = 'messages';

-- name: sync_standby_reset
-- Commits no longer wait for a standby (with a reload).
ALTER SYSTEM RESET synchronous_standby_names;

-- name: sync_standby_show
-- What a new session gets.
SHOW synchronous_standby_names;

-- name: waiting_for_standby
-- Backends of one application_name whose commit waits for a synchronous standby.
SELECT pid FROM pg_stat_activity WHERE application_name = %(app)s AND wait_event = 'SyncRep';

-- name: cancel_pid
-- Cancel one backend's wait (a commit waiting for a standby is then reported committed locally).
SELECT pg_cancel_backend(%(pid)s);
