-- 0002_exchanges: exchanges and bindings shared by every process, queue lifetime, message TTL.

CREATE TABLE {schema}.exchanges (
    name         text PRIMARY KEY,
    type         text NOT NULL CHECK (type IN ('direct', 'topic', 'fanout')),
    durable      boolean NOT NULL DEFAULT true,
    auto_delete  boolean NOT NULL DEFAULT false,
    arguments    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- pattern: for topic exchanges, a regular expression over '.' || routing_key
-- (computed by the client at bind time); unused by direct and fanout.
CREATE TABLE {schema}.bindings (
    exchange     text NOT NULL,
    routing_key  text NOT NULL,
    queue        text NOT NULL,
    pattern      text NOT NULL,
    arguments    jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (exchange, routing_key, queue)
);

CREATE INDEX bindings_queue_idx ON {schema}.bindings (queue);

-- Queue lifetime as RabbitMQ: x-expires (unused for that long: deleted),
-- auto_delete/exclusive (deleted once no consumer touched it for heartbeat_ttl),
-- x-message-ttl (ready messages older than that expire).
ALTER TABLE {schema}.queues
    ADD COLUMN durable       boolean NOT NULL DEFAULT true,
    ADD COLUMN auto_delete   boolean NOT NULL DEFAULT false,
    ADD COLUMN exclusive     boolean NOT NULL DEFAULT false,
    ADD COLUMN expires       interval,
    ADD COLUMN message_ttl   interval,
    ADD COLUMN consumed_at   timestamptz,
    ADD COLUMN last_used_at  timestamptz NOT NULL DEFAULT now();

ALTER TABLE {schema}.messages ADD COLUMN expires_at timestamptz;

CREATE INDEX messages_expiry_idx ON {schema}.messages (expires_at) WHERE expires_at IS NOT NULL;
