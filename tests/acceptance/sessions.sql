-- name: client_sessions
-- Every TCP client session on the server: its application_name and client port.
SELECT application_name, client_port
FROM pg_stat_activity
WHERE backend_type = 'client backend' AND client_port > 0;
