-- The fetcher's Stripe passes read the failed payment attempts received lately (app/core/stripe.py
-- FETCH_WANTED_RECENT), all of them only once an hour (FETCH_WANTED): failed attempts only
-- accumulate. An index by the time they were received serves both; it replaces 0016's by resource.
-- Building it reads webhook_events once.
CREATE INDEX webhook_events_stripe_failed_at ON webhook_events (received_at)
 WHERE gateway = 'stripe' AND event_type = 'payment_intent.payment_failed';
DROP INDEX webhook_events_stripe_failed;
