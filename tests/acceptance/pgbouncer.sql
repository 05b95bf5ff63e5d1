-- Statements of tests/acceptance/test_pgbouncer.py ({role} is a generated name).

-- name: role_create
-- A role of one test only: the sessions that reach PostgreSQL directly as it are that test's.
CREATE ROLE {role} LOGIN SUPERUSER;

-- name: role_drop
DROP ROLE IF EXISTS {role};

-- name: role_sessions_end
SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %(role)s;

-- name: role_sessions
-- application_name of every session on PostgreSQL itself as the role.
SELECT application_name FROM pg_stat_activity WHERE usename = %(role)s;

-- name: lock_timeout_get
SELECT current_setting('lock_timeout');
