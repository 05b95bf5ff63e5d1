-- name: client_sessions
-- Every TCP client session on the server: its application_name and client port.
SELECT application_name, client_port
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND client_port > 0;

-- name: session_state_change
-- When the session on one client port last changed state (a statement began or ended).
SELECT state_change
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND client_port = %(port)s;
