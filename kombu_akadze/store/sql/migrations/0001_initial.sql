-- 0001_initial: queues, consumers, messages and dead letters.
-- {schema} is replaced by the quoted schema name before this runs.

CREATE TABLE {schema}.queues (
    name          text PRIMARY KEY,
    max_attempts  integer CHECK (max_attempts IS NULL OR max_attempts > 0),
    arguments     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at    timestamptz NOT NULL DEFAULT now()
);

-- One row per consuming connection; held messages point here. A consumer
-- whose heartbeat_at is older than the heartbeat TTL is dead.
CREATE TABLE {schema}.consumers (
    id            text PRIMARY KEY,
    hostname      text NOT NULL,
    pid           integer NOT NULL,
    started_at    timestamptz NOT NULL DEFAULT now(),
    heartbeat_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.messages (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    queue             text NOT NULL,
    priority          smallint NOT NULL DEFAULT 0,
    body              bytea NOT NULL,
    content_type      text,
    content_encoding  text,
    headers           jsonb NOT NULL DEFAULT '{}'::jsonb,
    properties        jsonb NOT NULL DEFAULT '{}'::jsonb,
    state             text NOT NULL DEFAULT 'ready' CHECK (state IN ('ready', 'held')),
    available_at      timestamptz NOT NULL DEFAULT now(),
    run_count         integer NOT NULL DEFAULT 0,
    attempts          integer NOT NULL DEFAULT 0,
    owner             text,
    claimed_at        timestamptz,
    created_at        timestamptz NOT NULL DEFAULT now(),
    CHECK ((state = 'held') = (owner IS NOT NULL))
);

-- Serves the claim: only ready rows, in claim order within a queue.
CREATE INDEX messages_claim_idx
    ON {schema}.messages (queue, priority DESC, id)
    WHERE state = 'ready';

-- Serves rescue and release: held rows by owner.
CREATE INDEX messages_held_idx
    ON {schema}.messages (owner)
    WHERE state = 'held';

-- A message leaves `messages` only by a fenced ack; every other exit lands here.
CREATE TABLE {schema}.dead_letters (
    id                bigint PRIMARY KEY,
    queue             text NOT NULL,
    priority          smallint NOT NULL,
    body              bytea NOT NULL,
    content_type      text,
    content_encoding  text,
    headers           jsonb NOT NULL,
    properties        jsonb NOT NULL,
    run_count         integer NOT NULL,
    attempts          integer NOT NULL,
    reason            text NOT NULL,
    last_owner        text,
    created_at        timestamptz NOT NULL,
    dead_at           timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX dead_letters_queue_idx ON {schema}.dead_letters (queue, dead_at);
