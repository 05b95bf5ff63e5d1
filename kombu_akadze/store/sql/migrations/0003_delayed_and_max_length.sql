-- 0003_delayed_and_max_length: messages due later wait as 'delayed' (outside the claim
-- index, promoted when due); queues may cap their length (x-max-length, x-overflow).

ALTER TABLE {schema}.messages DROP CONSTRAINT messages_state_check;
ALTER TABLE {schema}.messages
    ADD CONSTRAINT messages_state_check CHECK (state IN ('ready', 'held', 'delayed'));

-- Serves the promotion of due delayed messages.
CREATE INDEX messages_delayed_idx ON {schema}.messages (available_at) WHERE state = 'delayed';

ALTER TABLE {schema}.queues
    ADD COLUMN max_length integer CHECK (max_length IS NULL OR max_length >= 0),
    ADD COLUMN overflow text NOT NULL DEFAULT 'drop-head' CHECK (overflow IN ('drop-head', 'reject-publish'));
