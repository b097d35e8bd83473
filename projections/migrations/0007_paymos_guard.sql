-- paymos rows are guarded by the worker's count of applied snapshots: a row from an older decision
-- never overwrites a newer one (updated_at alone cannot order two snapshots of the same millisecond).
ALTER TABLE paymos_invoices ADD COLUMN applied_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE paymos_withdrawals ADD COLUMN applied_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE paymos_channel_deposits ADD COLUMN applied_seq bigint NOT NULL DEFAULT 0;
