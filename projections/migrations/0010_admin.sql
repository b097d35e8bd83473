-- Operations (DESIGN.md §3.1, §5): every action taken through the admin API, the console or an
-- operator command, with who took it and what came of it.
CREATE TABLE admin_actions (
    id     bigserial PRIMARY KEY,
    at     timestamptz NOT NULL DEFAULT now(),
    actor  text NOT NULL,
    action text NOT NULL,
    target text NOT NULL,
    result text NOT NULL
);
CREATE INDEX admin_actions_newest ON admin_actions (at DESC);
-- The parked page and the search read the timeline by outcome and by recency.
CREATE INDEX webhook_events_parked ON webhook_events (gateway, resource_id) WHERE outcome = 'parked';
CREATE INDEX effects_dead ON effects (dead_at DESC) WHERE dead_at IS NOT NULL;
