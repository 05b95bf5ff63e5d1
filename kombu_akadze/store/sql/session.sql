-- Statements a session runs on itself: they touch no table.

-- name: session_setup
-- Run once per new connection. A pooler between us and PostgreSQL (PgBouncer) gives the client a
-- cancel key of its own, so the backend pid libpq was handed (%(client_pid)s) is not the pid of the
-- backend answering: then nothing is SET for the session, since under transaction pooling a session
-- SET stays on whichever server connection ran it (for other clients) and does not follow ours; the
-- role's settings (ALTER ROLE ... SET) are what bound statements there, and *_ok says whether they
-- already match. Direct, bound how long every statement may wait for a lock and run in all
-- (transport options lock_timeout, statement_timeout; '0' turns one off, NULL keeps the server's
-- setting): a statement past either fails with 55P03 / 57014, a transient error the caller retries.
-- A SET after connect rather than libpq's "options", which PgBouncer refuses unless told to ignore it.
-- With a lock timeout, a session left idle inside a transaction that long is ended by the server
-- (idle_in_transaction_session_timeout, set to the lock timeout): a client stopped in the middle of one (SIGSTOP,
-- a debugger, a frozen VM) must not keep its locks, or the fleet's rescue waits on them, and fails on
-- its own lock timeout, for as long as that client stays stopped.
SELECT pg_backend_pid() <> %(client_pid)s AS pooled,
       CASE WHEN pg_backend_pid() = %(client_pid)s THEN
           set_config('lock_timeout', COALESCE(%(lock_timeout)s, current_setting('lock_timeout')), false) END
           AS lock_timeout_set,
       CASE WHEN pg_backend_pid() = %(client_pid)s THEN
           set_config('statement_timeout', COALESCE(%(statement_timeout)s, current_setting('statement_timeout')), false) END
           AS statement_timeout_set,
       current_setting('lock_timeout')::interval
           = COALESCE(%(lock_timeout)s, current_setting('lock_timeout'))::interval AS lock_timeout_ok,
       current_setting('statement_timeout')::interval
           = COALESCE(%(statement_timeout)s, current_setting('statement_timeout'))::interval AS statement_timeout_ok,
       CASE WHEN pg_backend_pid() = %(client_pid)s AND %(idle_timeout)s::text IS NOT NULL THEN
           set_config('idle_in_transaction_session_timeout', %(idle_timeout)s::text, false) END
           AS idle_timeout_set;
