-- 0024_requeue_by_primary_key: requeue_or_bury finds its rows by id, through the primary key, and never
-- walks every held row of the table. What it reads and writes is unchanged; only how the planner may.
--
-- Its two statements named m.state = 'held', which is exactly messages_held_idx's predicate. plpgsql
-- keeps a generic plan once it costs no more than the custom ones, and planned generically (the ids an
-- unknown array) the planner read that whole index, every consumer's held rows, filtering each against
-- the ids. Measured on PostgreSQL 15 with 3,000 rows held: 0.49 ms per statement for a one-id requeue
-- (3,023 rows read and filtered out), against one primary-key lookup. A plan chosen generic while few
-- rows were held stays until the table's statistics change. Written as (... = 'held') IS TRUE the
-- condition is the same (a row no longer held matches nothing) but proves no partial index, so the plan
-- is the ids, each looked up by the primary key. message_requeue, message_release, message_refuse and
-- message_bury write their owner fence the same way (messages.sql), as the ack does since 0023. The
-- settings are 0007's and 0013's (CREATE OR REPLACE sets them anew).

CREATE OR REPLACE FUNCTION {schema}.requeue_or_bury(ids bigint[], default_max_attempts integer, why text)
RETURNS TABLE (message_id bigint, outcome text, queue text)
LANGUAGE plpgsql
VOLATILE
ROWS 10
SET enable_seqscan = off
SET enable_bitmapscan = off
SET jit = off
AS $$
DECLARE
    exhausted bigint[];
BEGIN
    SELECT COALESCE(array_agg(m.id), '{}') INTO exhausted
    FROM {schema}.messages AS m
    LEFT JOIN {schema}.queues AS q ON q.name = m.queue
    WHERE m.id = ANY (ids) AND (m.state = 'held') IS TRUE
      AND m.attempts >= COALESCE(q.max_attempts, default_max_attempts);
    RETURN QUERY SELECT b.id, 'dead'::text, NULL::text FROM {schema}.bury(exhausted, why) AS b(id);
    RETURN QUERY WITH requeued AS (
        UPDATE {schema}.messages AS m
        SET state = 'ready', owner = NULL, claimed_at = NULL
        WHERE m.id = ANY (ids) AND (m.state = 'held') IS TRUE AND m.id <> ALL (exhausted)
        RETURNING m.id, m.queue
    )
    SELECT r.id, 'ready'::text, r.queue FROM requeued AS r;
END
$$;
