-- Console sessions ended by "Sign out" (DESIGN.md §3.1): a session cookie is stateless (an HMAC of
-- its expiry and nonce), so signing out records its nonce here and the admin refuses it from then
-- on. Rows older than the longest session are of no use and may be deleted.
CREATE TABLE admin_ended_sessions (
    nonce    text PRIMARY KEY,
    ended_at timestamptz NOT NULL DEFAULT now()
);
