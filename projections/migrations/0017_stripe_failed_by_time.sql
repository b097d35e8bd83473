-- The fetcher's Stripe passes between two full ones (app/core/stripe.py FETCH_WANTED_RECENT, once an
-- hour FETCH_WANTED) look only at the PaymentIntents with a failed attempt or an attempt step
-- received lately: failed attempts only accumulate. These rows by the time they were received.
-- Building it reads webhook_events once; it holds writes, not reads, meanwhile.
CREATE INDEX webhook_events_stripe_tied_at ON webhook_events (received_at)
 WHERE gateway = 'stripe' AND event_type IN ('payment_intent.amount_capturable_updated',
       'payment_intent.payment_failed', 'payment_intent.processing', 'payment_intent.requires_action');
