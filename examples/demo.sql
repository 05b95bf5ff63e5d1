-- The demo's own table, outside the broker: which task arguments were done, and how often.
-- {schema} is the quoted demo schema (env AKADZE_DEMO_SCHEMA, default akadze_demo).

-- name: done_setup
-- Create the demo table if missing; the advisory lock keeps concurrent workers from racing on the catalog.
BEGIN;
SELECT pg_advisory_xact_lock(hashtext('kombu-akadze examples: done_setup'));
CREATE SCHEMA IF NOT EXISTS {schema};
CREATE TABLE IF NOT EXISTS {schema}.done (n integer PRIMARY KEY, runs integer NOT NULL);
COMMIT;

-- name: done_record
-- Mark n done; a second run of the same n only counts, so the task is idempotent.
INSERT INTO {schema}.done AS d (n, runs) VALUES (%(n)s, 1)
ON CONFLICT (n) DO UPDATE SET runs = d.runs + 1
RETURNING runs;

-- name: done_reset
-- Forget every recorded n (the demo starts from an empty table).
TRUNCATE {schema}.done;

-- name: done_progress
-- How many distinct n are done, how many of them ran more than once, and all runs.
SELECT count(*) AS done, count(*) FILTER (WHERE runs > 1) AS duplicated, COALESCE(sum(runs), 0) AS runs
FROM {schema}.done;

-- name: done_rows
-- Every recorded n with its run count.
SELECT n, runs FROM {schema}.done ORDER BY n;

-- name: schema_drop
-- Remove the demo schema (tests clean up after themselves).
DROP SCHEMA IF EXISTS {schema} CASCADE;
