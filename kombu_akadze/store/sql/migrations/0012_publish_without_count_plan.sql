-- 0012_publish_without_count_plan: the x-max-length check of a publish (message_insert, message_route)
-- moves into the function queue_has_room, called only for a queue that has x-overflow=reject-publish.
-- Before, the publish statement carried the count of the queue's messages as a subplan (a scan of
-- messages): never run for a queue without the limit, but built at every execution, and priced in
-- the plan, so a large backlog could push the plan's cost over jit_above_cost. Measured with pgbench
-- on PostgreSQL 15 (1 KB body, a queue without TTL or limit, medians of 5 alternating runs of the
-- old and new message_insert): backend CPU per statement on one session 69.5 -> 60.5 us (a bare
-- INSERT of the same row: 30.8 us); 8 sessions 6,943 -> 8,420 statements/s (bare INSERT 12,941/s).
-- The count itself is unchanged: ready and delayed messages of the queue, in the publish's snapshot.
CREATE FUNCTION {schema}.queue_has_room(queue_name text, max_length integer)
RETURNS boolean
LANGUAGE plpgsql
STABLE
AS $$
BEGIN
    RETURN (SELECT count(*) FROM {schema}.messages AS c
            WHERE c.queue = queue_name AND c.state IN ('ready', 'delayed')) < max_length;
END
$$;
