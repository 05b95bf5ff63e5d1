-- 0007_transitions: the two exits every abnormal end of a run shares, written once. bury moves rows
-- to dead letters; requeue_or_bury returns held rows to their queue with the attempt spent, or buries
-- those whose attempts are used up. message_requeue, message_bury, lease_rescue and message_expire
-- pick (and lock) their rows, fenced as each requires, and hand the ids to these functions.
-- The planner settings keep the id lookups on the primary key whatever the statistics say (as 0005).

-- Move messages to dead letters with a reason; the ids moved. The caller picked and locked the rows
-- (fenced on the run, or by the rule that ends them): this only moves them.
CREATE FUNCTION {schema}.bury(ids bigint[], why text)
RETURNS SETOF bigint
LANGUAGE plpgsql
VOLATILE
ROWS 10
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
BEGIN
    RETURN QUERY WITH dead AS (
        DELETE FROM {schema}.messages AS m
        WHERE m.id = ANY (ids)
        RETURNING m.*
    ), buried AS (
        INSERT INTO {schema}.dead_letters AS d
            (id, queue, priority, body, content_type, content_encoding, headers, properties,
             run_count, attempts, reason, last_owner, created_at)
        SELECT dead.id, dead.queue, dead.priority, dead.body, dead.content_type, dead.content_encoding,
               dead.headers, dead.properties, dead.run_count, dead.attempts, why, dead.owner, dead.created_at
        FROM dead
        RETURNING d.id
    )
    SELECT buried.id FROM buried;
END
$$;

-- An abnormal end of held runs (reject with requeue, a rescued lease): ready again in place with the
-- attempt spent; or dead letters once the queue's max_attempts (else default_max_attempts) is used
-- up. The caller picked and locked the rows, and wakes consumers of the queues of the 'ready' ones.
CREATE FUNCTION {schema}.requeue_or_bury(ids bigint[], default_max_attempts integer, why text)
RETURNS TABLE (message_id bigint, outcome text, queue text)
LANGUAGE plpgsql
VOLATILE
ROWS 10
SET enable_seqscan = off
SET enable_bitmapscan = off
AS $$
DECLARE
    exhausted bigint[];
BEGIN
    SELECT COALESCE(array_agg(m.id), '{}') INTO exhausted
    FROM {schema}.messages AS m
    LEFT JOIN {schema}.queues AS q ON q.name = m.queue
    WHERE m.id = ANY (ids) AND m.state = 'held'
      AND m.attempts >= COALESCE(q.max_attempts, default_max_attempts);
    RETURN QUERY SELECT b.id, 'dead'::text, NULL::text FROM {schema}.bury(exhausted, why) AS b(id);
    RETURN QUERY WITH requeued AS (
        UPDATE {schema}.messages AS m
        SET state = 'ready', owner = NULL, claimed_at = NULL
        WHERE m.id = ANY (ids) AND m.state = 'held' AND m.id <> ALL (exhausted)
        RETURNING m.id, m.queue
    )
    SELECT r.id, 'ready'::text, r.queue FROM requeued AS r;
END
$$;
