-- 0014_wake_one_queue: wake() keeps one generic plan per session (plan_cache_mode), and a publish into
-- one queue (every message_insert) picks its parked consumer with one plain statement instead of the
-- many-queue one (unnest, GROUP BY, LATERAL). Before, plpgsql planned the pick-and-delete statement
-- afresh at every call (a custom plan for its array argument): measured with pgbench on PostgreSQL 15,
-- one session, each round parks a consumer (INSERT into waiting) and wakes it: 0.75 ms a round with
-- the old wake(), 0.56 with the generic plan alone, 0.40 with this one; the same DELETE ... RETURNING
-- pg_notify written out as a plain statement: 0.39. wake() with nobody parked: 0.11-0.15 -> 0.10 ms.
-- At a trickle into an idle worker, that was 0.45 ms of every task's enqueue -> start latency.
-- The order that loses no wake-up is unchanged (0009): the queue lock first, then the look at
-- waiting with a fresh snapshot.
CREATE OR REPLACE FUNCTION {schema}.wake(queues text[])
RETURNS integer
LANGUAGE plpgsql
VOLATILE
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    woken integer;
BEGIN
    IF queues IS NULL OR cardinality(queues) = 0 THEN
        RETURN 0;
    ELSIF cardinality(queues) = 1 THEN
        PERFORM pg_advisory_xact_lock_shared(1634427002, hashtext(queues[1]));
        WITH picked AS (
            SELECT w.queue, w.consumer FROM {schema}.waiting AS w
            WHERE w.queue = queues[1]
            ORDER BY w.since
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        ), gone AS (
            DELETE FROM {schema}.waiting AS w USING picked
            WHERE w.queue = picked.queue AND w.consumer = picked.consumer
            RETURNING w.channel, w.queue
        )
        SELECT count(*) INTO woken FROM (SELECT pg_notify(g.channel, g.queue) FROM gone AS g) AS n;
        RETURN woken;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(1634427002, hashtext(s.q))
    FROM (SELECT DISTINCT q FROM unnest(queues) AS q ORDER BY q) AS s;
    IF NOT EXISTS (SELECT 1 FROM {schema}.waiting AS w WHERE w.queue = ANY (queues)) THEN
        RETURN 0;
    END IF;
    WITH wanted AS (
        SELECT q, count(*) AS n FROM unnest(queues) AS q GROUP BY q
    ), picked AS (
        SELECT p.queue, p.consumer
        FROM wanted
        CROSS JOIN LATERAL (
            SELECT w.queue, w.consumer FROM {schema}.waiting AS w
            WHERE w.queue = wanted.q
            ORDER BY w.since
            LIMIT wanted.n
            FOR UPDATE SKIP LOCKED
        ) AS p
    ), gone AS (
        DELETE FROM {schema}.waiting AS w USING picked
        WHERE w.queue = picked.queue AND w.consumer = picked.consumer
        RETURNING w.channel, w.queue
    )
    SELECT count(*) INTO woken FROM (SELECT pg_notify(g.channel, g.queue) FROM gone AS g) AS n;
    RETURN woken;
END
$$;
