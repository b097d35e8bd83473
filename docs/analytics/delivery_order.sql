-- Per gateway and day: how often webhooks arrived out of the gateway's order, how many were parked
-- and for how long, how many needed a fetch, and how many were stale or duplicates.
--
-- Input: a view `decisions` over `orderly export --topic decisions` (docs/analytics.md), e.g.
--   CREATE VIEW decisions AS SELECT * FROM read_parquet('decisions.parquet');
-- Run: duckdb -cmd "CREATE VIEW decisions AS ..." < docs/analytics/delivery_order.sql, or from Python.
--
-- Definitions (all from the decision fields; a day is the UTC date of the delivery's received_at_ms):
--   delivery       one delivery_id of a gateway (webhooks and fetched answers; the merchant's pg
--                  correlations are not deliveries of the gateway and are left out)
--   stale          its last outcome is `stale`: it arrived after a later state (in the gateway's
--                  order) had been applied, so it arrived out of order and was not applied
--   parked         it had a `parked` decision: it could not be applied when it arrived
--   parked_wait_ms from its arrival to the arrival of what released it: the decision just before
--                  its `unparked` one in the resource's ordinals (`seq`), which is the delivery that
--                  released it (the worker numbers a trigger's decision first, then the unparks)
--   still_parked   parked and not released (yet)
--   out_of_order   stale, or parked then released where parking waits for an EARLIER event of the
--                  gateway (card, adyen: an event before its predecessor; paymos: a change out of a
--                  terminal state before its reorg). pg parks a deposit for the merchant's
--                  correlation and stripe a thin event for its fetched object: not gateway order.
--   fetched        outcome `synced`: a fetched answer of the gateway's API applied as an event
--   duplicate      its last outcome is `duplicate`: the same event had been delivered before
WITH once AS (
    -- a delivery decided again after a worker's crash is written again with the same decision
    SELECT DISTINCT gateway, resource_id, delivery_id, seq, outcome, received_at_ms, event_type
    FROM decisions
),
parks_for_order(gateway) AS (VALUES ('card'), ('adyen'), ('paymos')),
released AS (
    SELECT u.gateway, u.resource_id, u.delivery_id,
           (SELECT max_by(t.received_at_ms, t.seq) FROM once t
             WHERE t.gateway = u.gateway AND t.resource_id = u.resource_id
               AND t.seq < u.seq AND t.outcome <> 'unparked') AS released_at_ms
    FROM once u
    WHERE u.outcome = 'unparked'
),
per_delivery AS (
    SELECT o.gateway, o.resource_id, o.delivery_id,
           min(o.received_at_ms) AS received_at_ms,
           arg_max(o.outcome, o.seq) AS last_outcome,
           bool_or(o.outcome = 'parked') AS was_parked,
           bool_or(o.outcome = 'synced') AS was_fetched,
           max(r.released_at_ms) AS released_at_ms
    FROM once o
    LEFT JOIN released r USING (gateway, resource_id, delivery_id)
    WHERE o.event_type IS DISTINCT FROM 'correlation.registered'
    GROUP BY o.gateway, o.resource_id, o.delivery_id
)
SELECT gateway,
       CAST(epoch_ms(received_at_ms) AS DATE) AS day,
       count(*) AS deliveries,
       count(*) FILTER (WHERE last_outcome = 'stale'
                        OR (was_parked AND released_at_ms IS NOT NULL
                            AND gateway IN (SELECT gateway FROM parks_for_order))) AS out_of_order,
       count(*) FILTER (WHERE was_parked) AS parked,
       count(*) FILTER (WHERE was_parked AND last_outcome = 'parked') AS still_parked,
       CAST(median(released_at_ms - received_at_ms) FILTER (WHERE was_parked) AS BIGINT) AS parked_wait_ms_p50,
       max(released_at_ms - received_at_ms) FILTER (WHERE was_parked) AS parked_wait_ms_max,
       count(*) FILTER (WHERE was_fetched) AS fetched,
       count(*) FILTER (WHERE last_outcome = 'stale') AS stale,
       count(*) FILTER (WHERE last_outcome = 'duplicate') AS duplicate
FROM per_delivery
GROUP BY gateway, day
ORDER BY gateway, day;
