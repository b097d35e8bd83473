-- The adyen gateway's read model (DESIGN.md §2.6, §5; docs/gateways/adyen.md). Totals are written
-- whole from the reducer's output, never incremented; a row written for an older reducer run (fewer
-- stored items) never overwrites a newer one. updated_at is the eventDate of the latest applied
-- item (Adyen's time, so replay writes the same row).
CREATE TABLE adyen_payments (
  psp_reference      text PRIMARY KEY,
  merchant_reference text,
  state              text NOT NULL
                     CHECK (state IN ('authorised','refused','cancelled','captured','refunded','chargeback')),
  authorised_minor   bigint NOT NULL DEFAULT 0 CHECK (authorised_minor >= 0),
  captured_minor     bigint NOT NULL DEFAULT 0 CHECK (captured_minor >= 0),
  refunded_minor     bigint NOT NULL DEFAULT 0 CHECK (refunded_minor >= 0 AND refunded_minor <= captured_minor),
  currency           text,
  updated_at         timestamptz NOT NULL,
  version            bigint NOT NULL DEFAULT 0
);
