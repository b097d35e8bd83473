-- The fetcher's Stripe passes between two full ones (app/core/stripe.py FETCH_WANTED_RECENT, once an
-- hour FETCH_WANTED: app/fetch_passes.py) look only at the PaymentIntents with a failed attempt or an
-- attempt step written lately: failed attempts only accumulate. These rows by the time they reached
-- the read model. "projected_at IS NOT NULL" (always true) leaves it to queries on that column: the
-- full query keeps 0016's index, which serves it twice as fast. Building it reads webhook_events
-- once; it holds writes, not reads, meanwhile.
CREATE INDEX webhook_events_stripe_tied_at ON webhook_events (projected_at)
 WHERE gateway = 'stripe' AND event_type IN ('payment_intent.amount_capturable_updated',
       'payment_intent.payment_failed', 'payment_intent.processing', 'payment_intent.requires_action')
   AND projected_at IS NOT NULL;
