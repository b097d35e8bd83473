-- Indexes for reads made on a timer, so that their cost follows what they look for, not the whole
-- history (docs/operations.md, "Reads on a timer"):
-- the projector's gauge of quarantined records per stage (every 5 s) and the console's count of them
-- read only the records not redriven;
CREATE INDEX quarantine_open ON quarantine (stage) WHERE redriven_at IS NULL;
-- the fetcher's Stripe pass (every ORDERLY_FETCH_INTERVAL_S, app/core/stripe.py FETCH_WANTED) reads
-- only the failed payment attempts, not every delivery. Building it reads webhook_events once.
CREATE INDEX webhook_events_stripe_failed ON webhook_events (resource_id)
 WHERE gateway = 'stripe' AND event_type = 'payment_intent.payment_failed';
-- The console's newest resources (its first page, /resources without a search) read back in time a
-- slice at a time (app/admin/queries.py _recent): a BRIN index, a few pages' worth for the whole
-- table, as deliveries are stored in about the order they were received. Summarised as each range
-- fills (autosummarize), not only at a vacuum: a range not summarised is read on every slice.
CREATE INDEX webhook_events_received_brin ON webhook_events USING brin (received_at)
  WITH (autosummarize = on);
-- The overview's counts are stale once an operator changed something (app/admin/queries.py
-- LAST_CHANGE, read on each read of fresh counts): the newest such action at once.
CREATE INDEX admin_actions_changes ON admin_actions (at)
 WHERE action IN ('effects.retry', 'effects.retry.bulk', 'quarantine.redrive', 'quarantine.redrive.bulk',
                  'resources.fetch');
