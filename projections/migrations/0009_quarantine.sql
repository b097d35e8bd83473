-- Records set aside by any stage (DESIGN.md §2.4, §5), fed from orderly.quarantine by the projector
-- process. `topic` and `record_key` say where a redrive appends `body` again: orderly.raw for what
-- the ingest or the worker set aside, the stage's own input topic for the projector and effects.
CREATE TABLE quarantine (
    delivery_id    text PRIMARY KEY,
    gateway        text,
    resource_id    text,
    stage          text NOT NULL,
    reason         text NOT NULL,
    received_at    timestamptz,
    quarantined_at timestamptz NOT NULL DEFAULT now(),
    topic          text,
    record_key     bytea,
    headers        jsonb NOT NULL DEFAULT '[]',
    body           bytea NOT NULL,
    redriven_at    timestamptz,
    redrives       integer NOT NULL DEFAULT 0
);
CREATE INDEX quarantine_resource ON quarantine (gateway, resource_id);
CREATE INDEX quarantine_newest ON quarantine (quarantined_at DESC);
