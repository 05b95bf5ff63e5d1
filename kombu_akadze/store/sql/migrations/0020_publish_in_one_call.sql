-- 0020_publish_in_one_call: a publish into one queue is one call of the function publish, which does
-- what message_insert's statement did in five CTEs (the queue's settings, the pick of a parked
-- consumer through handoff_pick, the INSERT, the NOTIFY) as plain statements. The CTEs, the
-- set-returning handoff_pick in a LATERAL join and the final join cost the server more than the
-- row itself. Measured on PostgreSQL 15 on this project's 2-core machine (one session, 5,000 publishes
-- of ~1 KB into a queue nobody waits on, synchronous_commit off so CPU is what is timed, backend CPU
-- per statement, medians of 7 alternating rounds, three runs): the 0019 statement 246-262 us, this
-- function 224-242 us, the bare INSERT of the same row 144-146 us. A handoff's notification is built
-- in the INSERT's RETURNING (the row as written), only when there is one. message_route calls it
-- once per bound queue that matches.
--
-- What a publish does is unchanged from 0019: TTL from the message or the queue, whichever is shorter;
-- a queue at its x-max-length with x-overflow=reject-publish takes nothing (NULL is returned); due
-- later, state 'delayed'; a ready message goes to the consumer parked longest on its queue, held by
-- it and carried in the notification (handoff), or in ready with a wake-up naming the queue (a
-- consumer that does not take handoffs, or a message too big for a notification); nobody parked, no
-- NOTIFY. durable false (a transient message under transient_async): this transaction commits
-- without waiting for the WAL flush.
--
-- The order that loses no wake-up is 0009's and 0017's: the queue's lock shared, then the look at
-- waiting, then the pick. Each statement of a VOLATILE function reads a snapshot taken when it starts,
-- so the look at waiting sees every park committed before the lock was granted. handoff_pick stays
-- for the statements of the previous release.
CREATE FUNCTION {schema}.publish(q text, prio smallint, payload bytea, ctype text, cenc text, hdrs jsonb,
                                 props jsonb, delay float8, ttl float8, not_before timestamptz,
                                 durable boolean, at timestamptz)
RETURNS bigint
LANGUAGE plpgsql
VOLATILE
SET jit = off
AS $$
DECLARE
    now_ timestamptz := COALESCE(at, now());
    avail timestamptz := GREATEST(COALESCE(at, now()) + make_interval(secs => delay),
                                  COALESCE(not_before, '-infinity'));
    message_ttl interval;
    max_length integer;
    overflow text;
    to_consumer text;
    to_channel text;
    slots integer;
    handoff boolean := false;
    parked boolean := false;
    new_id bigint;
    payload_json text;
BEGIN
    IF durable IS NOT TRUE THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    SELECT qs.message_ttl, qs.max_length, qs.overflow INTO message_ttl, max_length, overflow
    FROM {schema}.queues AS qs WHERE qs.name = q;
    IF max_length IS NOT NULL AND overflow = 'reject-publish' AND NOT {schema}.queue_has_room(q, max_length) THEN
        RETURN NULL;
    END IF;
    IF avail <= now_ THEN
        PERFORM pg_advisory_xact_lock_shared(hashtextextended('{schema_hex}:' || q, 1634427002));
        IF EXISTS (SELECT 1 FROM {schema}.waiting AS w WHERE w.queue = q) THEN
            SELECT w.consumer, w.channel, w.slots INTO to_consumer, to_channel, slots
            FROM {schema}.waiting AS w
            WHERE w.queue = q
            ORDER BY w.since
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF FOUND THEN
                handoff := slots IS NOT NULL AND {schema}.handoff_fits(q, payload, ctype, cenc, hdrs, props);
                parked := handoff AND slots > 1;
                IF parked THEN
                    UPDATE {schema}.waiting AS w SET slots = w.slots - 1, since = clock_timestamp()
                    WHERE w.queue = q AND w.consumer = to_consumer;
                ELSE
                    DELETE FROM {schema}.waiting AS w WHERE w.queue = q AND w.consumer = to_consumer;
                END IF;
            END IF;
        END IF;
    END IF;
    INSERT INTO {schema}.messages AS m
        (queue, priority, body, content_type, content_encoding, headers, properties,
         state, available_at, expires_at, run_count, attempts, owner, claimed_at)
    VALUES (q, prio, payload, ctype, cenc, hdrs, props,
            CASE WHEN avail > now_ THEN 'delayed' WHEN handoff THEN 'held' ELSE 'ready' END, avail,
            now_ + make_interval(secs => LEAST(ttl, extract(epoch FROM message_ttl)::float8)),
            CASE WHEN handoff THEN 1 ELSE 0 END, CASE WHEN handoff THEN 1 ELSE 0 END,
            CASE WHEN handoff THEN to_consumer END, CASE WHEN handoff THEN now_ END)
    RETURNING m.id, CASE WHEN handoff THEN {schema}.handoff_payload(m, parked) END INTO new_id, payload_json;
    IF handoff THEN
        PERFORM pg_notify(to_channel, payload_json);
    ELSIF to_channel IS NOT NULL THEN
        PERFORM pg_notify(to_channel, q);
    END IF;
    RETURN new_id;
END
$$;
