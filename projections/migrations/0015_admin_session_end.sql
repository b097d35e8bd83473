-- Console sessions (issue #45): the ID token a session signed in with, sent back to the issuer as
-- id_token_hint when the person signs out (OpenID Connect RP-Initiated Logout 1.0); and an index for
-- the admin's purge of ended and expired sessions, which keeps the table bounded.
ALTER TABLE admin_sessions ADD COLUMN id_token text;
CREATE INDEX admin_sessions_last_seen ON admin_sessions (last_seen_at);
