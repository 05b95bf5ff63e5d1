-- 0011_one_call_ack_claim: the hot path (message_ack_claim) calls one function, ack_claim, instead of
-- ack and claim_park (which calls claim); with one queue, the usual case, it claims with one statement
-- and parks without copying rows into arrays. ack keeps one generic plan per session, as 0010 did
-- for claim and claim_park: PL/pgSQL kept planning its DELETE at every call.
--
-- Measured with pgbench on PostgreSQL 15 (one session, prepared, synchronous_commit off; the latency of
-- the message_ack_claim statement, median of 5 runs alternated with the old functions in another
-- schema): ack 1 + claim 1 from a 200,000-message backlog 0.296 -> 0.123 ms; ack 1 + a claim of an
-- empty queue that parks 0.348 -> 0.111 ms; a claim of 4 from the backlog 0.402 -> 0.238 ms. Where
-- the time went: ack 0.093 ms a call against 0.019 for its DELETE alone (0.037 with a generic plan;
-- with that alone the three cases were 0.167, 0.180, 0.291 ms); claim_park 0.147 ms against 0.099
-- for a bare UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) (nested calls, rows
-- copied through arrays, the short-queue bookkeeping); the planner settings on the functions cost
-- about 0.001 ms each and stay, so the plans keep walking the indexes whatever the statistics say.
--
-- claim and claim_park stay as they were (ack gains only the generic plan), for workers of the previous
-- release during a rolling upgrade (and message_claim, message_ack keep calling claim, ack).

ALTER FUNCTION {schema}.ack(bigint[], integer[], text)
    SET plan_cache_mode = force_generic_plan;

-- Delete the runs claimer finished (fenced on (id, run_count, owner), as ack), then hold up to
-- limits[i] ready messages of queues[i] for it (as claim: priority first, then publish order, SKIP
-- LOCKED, run_count bumped, an attempt spent), then, given a channel, park it on the queues the claim
-- came back short for (as claim_park: the queue's lock taken exclusively without waiting, then one
-- more claim with a fresh snapshot; a queue whose lock a publisher holds comes back as a 'retry' row).
-- Rows by kind: 'acked' (id only), 'claimed', 'retry' (queue only). Several queues: claim_park's rows.
-- The acks go first, so a consumer parked on a queue (holding its lock) never then waits on a row lock
-- while a publisher to that queue waits for it.
CREATE FUNCTION {schema}.ack_claim(
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
AS $$
#variable_conflict use_column
DECLARE
    took integer;
    late integer;
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
    IF cardinality(queues) IS DISTINCT FROM 1 OR cardinality(limits) IS DISTINCT FROM 1 THEN
        RETURN QUERY SELECT c.id, c.queue, c.priority, c.body, c.content_type, c.content_encoding,
                            c.headers, c.properties, c.run_count, c.attempts,
                            CASE WHEN c.id IS NULL THEN 'retry' ELSE 'claimed' END
        FROM {schema}.claim_park(queues, limits, claimer, at, channel) AS c;
        RETURN;
    END IF;
    -- One queue. = ANY(ARRAY(...)) keeps the update a primary-key lookup of the picked ids (as claim).
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
            WHERE p.queue = queues[1]
              AND p.state = 'ready'
              AND p.available_at <= COALESCE(at, now())
              AND (p.expires_at IS NULL OR p.expires_at > COALESCE(at, now()))
            ORDER BY p.priority DESC, p.id
            LIMIT limits[1]
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING m.id, m.queue, m.priority, m.body, m.content_type, m.content_encoding, m.headers,
                  m.properties, m.run_count, m.attempts
    )
    SELECT c.id, c.queue, c.priority, c.body, c.content_type, c.content_encoding, c.headers,
           c.properties, c.run_count, c.attempts, 'claimed'::text
    FROM claimed AS c;
    GET DIAGNOSTICS took = ROW_COUNT;
    IF channel IS NULL OR (took < limits[1]) IS NOT TRUE THEN
        RETURN;
    END IF;
    IF NOT pg_try_advisory_xact_lock(1634427002, hashtext(queues[1])) THEN
        RETURN QUERY SELECT NULL::bigint, queues[1], NULL::smallint, NULL::bytea, NULL::text, NULL::text,
                            NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer, 'retry'::text;
        RETURN;
    END IF;
    INSERT INTO {schema}.waiting (queue, consumer, channel)
    VALUES (queues[1], claimer, channel)
    ON CONFLICT (queue, consumer) DO NOTHING;
    -- A new statement, so a fresh snapshot: whatever was committed before the lock was taken.
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
            WHERE p.queue = queues[1]
              AND p.state = 'ready'
              AND p.available_at <= COALESCE(at, now())
              AND (p.expires_at IS NULL OR p.expires_at > COALESCE(at, now()))
            ORDER BY p.priority DESC, p.id
            LIMIT limits[1] - took
            FOR UPDATE SKIP LOCKED
        ))
        RETURNING m.id, m.queue, m.priority, m.body, m.content_type, m.content_encoding, m.headers,
                  m.properties, m.run_count, m.attempts
    )
    SELECT c.id, c.queue, c.priority, c.body, c.content_type, c.content_encoding, c.headers,
           c.properties, c.run_count, c.attempts, 'claimed'::text
    FROM claimed AS c;
    GET DIAGNOSTICS late = ROW_COUNT;
    IF late > 0 THEN
        DELETE FROM {schema}.waiting AS w WHERE w.consumer = claimer AND w.queue = queues[1];
    END IF;
END
$$;
