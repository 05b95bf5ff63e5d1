-- 0022_handoff_functions_inline: the two SQL functions of a handoff, handoff_fits (the size check) and
-- handoff_payload (the notification), are inlined into the statements of publish that call them. They
-- carried SET jit = off, and PostgreSQL never inlines a function with a SET clause: each call went through
-- the function manager with its settings saved and restored, and a SQL function that is not inlined has
-- its body parsed and planned again in every transaction that calls it. Each publish to a parked
-- consumer paid that twice. Measured on PostgreSQL 15 on this project's 2-core machine (one session,
-- 3,000 rounds of park then publish of a ~330-byte Celery-shaped message, asynchronous commit, backend
-- CPU from /proc): the publish took 341-351 us (wall, median) and 390-397 us of server CPU per round
-- with 0018's functions, 259-265 us and 303 us with these.
--
-- They run with JIT off all the same: inlined, they are part of the statement that calls them, and
-- publish (their only caller but 0019's handoff_pick, kept for the previous release) runs with jit off.
-- handoff_payload is STABLE, as json_build_object is (PostgreSQL inlines no function declared more
-- constant than its body). What they compute is unchanged.
CREATE OR REPLACE FUNCTION {schema}.handoff_payload(m {schema}.messages, parked boolean)
RETURNS text
LANGUAGE sql
STABLE
AS $$
    SELECT json_build_object(
        'akadze_handoff', 1, 'parked', parked, 'id', m.id, 'queue', m.queue, 'priority', m.priority,
        'run_count', m.run_count, 'attempts', m.attempts, 'content_type', m.content_type,
        'content_encoding', m.content_encoding, 'headers', m.headers, 'properties', m.properties,
        'body', translate(encode(m.body, 'base64'), E'\n', ''))::text
$$;

CREATE OR REPLACE FUNCTION {schema}.handoff_fits(queue text, body bytea, content_type text, content_encoding text,
                                                 headers jsonb, properties jsonb)
RETURNS boolean
LANGUAGE sql
IMMUTABLE
AS $$
    SELECT (octet_length(body) + 2) / 3 * 4 + octet_length(headers::text) + octet_length(properties::text)
           + octet_length(queue) + COALESCE(octet_length(content_type), 0)
           + COALESCE(octet_length(content_encoding), 0) + 400 <= 7900
$$;
