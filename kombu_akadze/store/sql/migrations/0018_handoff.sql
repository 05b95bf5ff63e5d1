-- 0018_handoff: a publish hands its message to a consumer parked on its queue instead of waking it to
-- claim. The row goes in already held by that consumer (run_count 1, an attempt spent, as a claim
-- would leave it) and the NOTIFY that woke the consumer carries the message itself (JSON, the body in
-- base64): the consumer delivers it without a claim statement. In a fleet of idle workers a task cost
-- publish + the LISTEN session's read of the notification + claim + ack; it is now publish + read +
-- ack, and the claim's round trip (1.26 ms of 2.27 ms from notification to task start, traced at 8
-- workers) leaves the latency.
--
-- Parked consumers say how many messages they take this way (waiting.slots: the free slots of the
-- claim that came back short); each handoff spends one and moves the consumer to the back of the line,
-- the last deletes the row. slots NULL (a park by a worker of an earlier release, through the 7-argument
-- ack_claim or claim_park): woken to claim, as before. A message whose notification would not fit
-- PostgreSQL's 8,000-byte payload goes in ready and wakes its consumer as before.
--
-- A handoff whose notification never reaches its consumer (LISTEN session lost, relay gone) is a row
-- held under a live consumer that does not know it: the reconcile (lease_orphans) gives it back; under
-- a dead one, rescue does. A consumer that stops cleanly gives back what is held under its id.
-- The order that loses no wake-up is unchanged (0009, 0017): the queue's lock shared, then the look at
-- waiting, then the pick.

ALTER TABLE {schema}.waiting ADD COLUMN slots integer CHECK (slots IS NULL OR slots > 0);

-- ROWS 1 (it returns one row at most): planned with the default 1,000, the publish statement priced
-- itself past jit_above_cost and a server with JIT on compiled it at every publish (+25 ms each).
-- Pick the consumer longest parked on q, for a message about to be published there (go: it will be
-- ready, and the queue has room). handoff: it takes the message (its slots spend one), else it is woken
-- to claim (its row goes: a worker of an earlier release, or fits false); still_parked: a handoff left
-- it slots, so it stays parked. No row: nobody is parked.
CREATE FUNCTION {schema}.handoff_pick(q text, fits boolean, go boolean)
RETURNS TABLE (to_consumer text, to_channel text, handoff boolean, still_parked boolean)
LANGUAGE plpgsql
VOLATILE
ROWS 1
SET jit = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    picked record;
BEGIN
    IF go IS NOT TRUE THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema_hex}:' || q, 1634427002));
    IF NOT EXISTS (SELECT 1 FROM {schema}.waiting AS w WHERE w.queue = q) THEN
        RETURN;
    END IF;
    SELECT w.consumer, w.channel, w.slots INTO picked
    FROM {schema}.waiting AS w
    WHERE w.queue = q
    ORDER BY w.since
    LIMIT 1
    FOR UPDATE SKIP LOCKED;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    handoff := picked.slots IS NOT NULL AND fits;
    IF handoff AND picked.slots > 1 THEN
        UPDATE {schema}.waiting AS w SET slots = w.slots - 1, since = clock_timestamp()
        WHERE w.queue = q AND w.consumer = picked.consumer;
    ELSE
        DELETE FROM {schema}.waiting AS w WHERE w.queue = q AND w.consumer = picked.consumer;
    END IF;
    to_consumer := picked.consumer;
    to_channel := picked.channel;
    still_parked := handoff AND picked.slots > 1;
    RETURN NEXT;
END
$$;

-- The notification that hands a message over: JSON (the body in base64), led by the akadze_handoff key
-- that tells it from a wake-up (whose payload is a queue name). parked: the consumer is still parked on
-- the queue (slots left); false, it parks again with its next claim.
CREATE FUNCTION {schema}.handoff_payload(m {schema}.messages, parked boolean)
RETURNS text
LANGUAGE sql
IMMUTABLE
SET jit = off
AS $$
    SELECT json_build_object(
        'akadze_handoff', 1, 'parked', parked, 'id', m.id, 'queue', m.queue, 'priority', m.priority,
        'run_count', m.run_count, 'attempts', m.attempts, 'content_type', m.content_type,
        'content_encoding', m.content_encoding, 'headers', m.headers, 'properties', m.properties,
        'body', translate(encode(m.body, 'base64'), E'\n', ''))::text
$$;

-- Whether a message of these sizes hands over in one notification (PostgreSQL's limit: 8,000 bytes),
-- with room to spare for the keys and numbers around them.
CREATE FUNCTION {schema}.handoff_fits(queue text, body bytea, content_type text, content_encoding text,
                                      headers jsonb, properties jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
SET jit = off
AS $$
    SELECT (octet_length(body) + 2) / 3 * 4 + octet_length(headers::text) + octet_length(properties::text)
           + octet_length(queue) + COALESCE(octet_length(content_type), 0)
           + COALESCE(octet_length(content_encoding), 0) + 400 <= 7900
$$;

-- ack_claim as 0017, parking with slots when handoff is true (this release's workers: they take a
-- handed-over message). The 7-argument ack_claim stays, for workers of the previous release.
CREATE FUNCTION {schema}.ack_claim(
    ack_ids bigint[], ack_run_counts integer[], claimer text,
    queues text[], limits integer[], at timestamptz, channel text, handoff boolean)
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
            IF NOT pg_try_advisory_xact_lock(hashtextextended('{schema_hex}:' || queues[i], 1634427002)) THEN
                RETURN QUERY SELECT NULL::bigint, queues[i], NULL::smallint, NULL::bytea, NULL::text,
                                    NULL::text, NULL::jsonb, NULL::jsonb, NULL::integer, NULL::integer,
                                    'retry'::text;
                EXIT;
            END IF;
            INSERT INTO {schema}.waiting (queue, consumer, channel, slots)
            VALUES (queues[i], claimer, channel, CASE WHEN handoff THEN limits[i] - took END)
            ON CONFLICT (queue, consumer) DO UPDATE SET channel = EXCLUDED.channel, slots = EXCLUDED.slots;
            parked := true;
        END LOOP;
    END LOOP;
END
$$;
