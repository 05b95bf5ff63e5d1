-- 0015_ack_claim_many_queues: ack_claim claims from several queues the way 0011 claims from one, a
-- queue at a time, instead of calling claim_park (nested functions, rows copied through arrays, then
-- every short queue locked, parked on and claimed again in one more pass). A Celery worker with remote
-- control on (Celery's default) consumes two queues, its task queue and its pidbox, so every ack+claim
-- of such a worker took the slower path. pgbench, one session, two queues: an idle claim that parks on
-- both 0.21-0.23 -> 0.16-0.17 ms; a claim of 1 from a 100,000-message backlog and a park on the other
-- 0.27-0.29 -> 0.21-0.22 ms; one queue unchanged (0.15-0.19 ms). The protocol is the same per
-- queue: claim; if short, take the queue's lock without waiting (a publisher holding it: a 'retry'
-- row), record the park, claim again with a fresh snapshot. The locks are tried, never waited for, so
-- the order of the queues cannot deadlock. claim_park stays, for workers of the previous release.
CREATE OR REPLACE FUNCTION {schema}.ack_claim(
    ack_ids bigint[], ack_run_counts integer[], claimer text,
    queues text[], limits integer[], at timestamptz, channel text)
RETURNS TABLE (id bigint, queue text, priority smallint, body bytea, content_type text,
               content_encoding text, headers jsonb, properties jsonb, run_count integer,
               attempts integer, kind text)
LANGUAGE plpgsql
VOLATILE
ROWS 10
SET enable_seqscan = off
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
SET jit = off
AS $$
#variable_conflict use_column
DECLARE
    took integer;
    late integer;
    i integer;
    parked boolean;
BEGIN
    IF cardinality(ack_ids) > 0 THEN
        RETURN QUERY WITH acked AS (
            DELETE FROM {schema}.messages AS m
            USING unnest(ack_ids, ack_run_counts) AS t(id, run_count)
            WHERE m.id = t.id AND m.run_count = t.run_count AND m.state = 'held' AND m.owner = claimer
            RETURNING m.id
        )
        SELECT a.id, NULL::text, NULL::smallint, NULL::bytea, NULL::text, NULL::text, NULL::jsonb,
               NULL::jsonb, NULL::integer, NULL::integer, 'acked'::text
        FROM acked AS a;
    END IF;
    -- Each queue in turn, as 0011 did for one: = ANY(ARRAY(...)) keeps the update a primary-key lookup
    -- of the picked ids (as claim). A queue the claim came back short for is parked on at once: its
    -- lock taken without waiting (a publisher holds it: a 'retry' row), the park recorded, then the
    -- same claim once more, a new statement, so a fresh snapshot: whatever was committed before the
    -- lock was taken.
    FOR i IN 1 .. LEAST(COALESCE(cardinality(queues), 0), COALESCE(cardinality(limits), 0)) LOOP
        took := 0;
        parked := false;
        LOOP
            RETURN QUERY WITH claimed AS (
                UPDATE {schema}.messages AS m
                SET state = 'held',
                    owner = claimer,
                    run_count = m.run_count + 1,
                    attempts = m.attempts + 1,
                    claimed_at = COALESCE(at, now())
                WHERE m.id = ANY (ARRAY(
                    SELECT p.id
                    FROM {schema}.messages AS p
                    WHERE p.queue = queues[i]
                      AND p.state = 'ready'
                      AND p.available_at <= COALESCE(at, now())
                      AND (p.expires_at IS NULL OR p.expires_at > COALESCE(at, now()))
                    ORDER BY p.priority DESC, p.id
                    LIMIT limits[i] - took
                    FOR UPDATE SKIP LOCKED
                ))
                RETURNING m.id, m.queue, m.priority, m.body, m.content_type, m.content_encoding, m.headers,
                          m.properties, m.run_count, m.attempts
            )
            SELECT c.id, c.queue, c.priority, c.body, c.content_type, c.content_encoding, c.headers,
                   c.properties, c.run_count, c.attempts, 'claimed'::text
            FROM claimed AS c;
            GET DIAGNOSTICS late = ROW_COUNT;
            took := took + late;
            IF parked THEN
                IF late > 0 THEN
                    DELETE FROM {schema}.waiting AS w WHERE w.consumer = claimer AND w.queue = queues[i];
                END IF;
                EXIT;
            END IF;
            EXIT WHEN channel IS NULL OR (took < limits[i]) IS NOT TRUE;
            IF NOT pg_try_advisory_xact_lock(1634427002, hashtext(queues[i])) THEN
                RETURN QUERY SELECT NULL::bigint, queues[i], NULL::smallint, NULL::bytea, NULL::text,
                                    NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
                                    'retry'::text;
                EXIT;
            END IF;
            INSERT INTO {schema}.waiting (queue, consumer, channel)
            VALUES (queues[i], claimer, channel)
            ON CONFLICT (queue, consumer) DO NOTHING;
            parked := true;
        END LOOP;
    END LOOP;
END
$$;
