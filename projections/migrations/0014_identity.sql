-- Who is at the console (DESIGN.md §3.1, §5; issue #45).
-- The audit trail is append-only, like pg_deposit_overpayment_flags: an UPDATE or DELETE fails.
CREATE FUNCTION admin_actions_reject_mutation() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'admin_actions is append-only' USING ERRCODE = '55000';
END;
$$;
CREATE TRIGGER admin_actions_immutable
  BEFORE UPDATE OR DELETE ON admin_actions
  FOR EACH ROW EXECUTE FUNCTION admin_actions_reject_mutation();
CREATE INDEX admin_actions_actor ON admin_actions (actor, at DESC);

-- Console sessions, server-side: the cookie holds a random id, this table its SHA-256, who signed
-- in with which role, and when it was last used; idle and absolute limits are checked against it
-- and signing out sets ended_at. Rows of ended or expired sessions may be deleted.
CREATE TABLE admin_sessions (
    id_hash      text PRIMARY KEY,
    person       text NOT NULL,
    role         text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    via          text NOT NULL,              -- 'oidc' or 'break-glass'
    csrf         text NOT NULL,
    source       text NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    last_seen_at timestamptz NOT NULL DEFAULT now(),
    ended_at     timestamptz
);

-- A sign-in under way: the state sent to the issuer, with the nonce and PKCE verifier it must come
-- back to; taken (deleted) by the callback, so each state is used once.
CREATE TABLE admin_sign_ins (
    state      text PRIMARY KEY,
    nonce      text NOT NULL,
    verifier   text NOT NULL,
    next       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- Personal API tokens (DESIGN.md §3.1): only a hash is stored.
CREATE TABLE admin_tokens (
    id           bigserial PRIMARY KEY,
    name         text NOT NULL,
    owner        text NOT NULL,
    role         text NOT NULL CHECK (role IN ('viewer', 'operator', 'admin')),
    hash         text NOT NULL UNIQUE,
    created_at   timestamptz NOT NULL DEFAULT now(),
    expires_at   timestamptz NOT NULL,
    last_used_at timestamptz,
    revoked_at   timestamptz
);

-- The random key of the console's flash-message MACs, made once and shared by every admin process
-- (never derived from a credential).
CREATE TABLE admin_server_keys (
    purpose text PRIMARY KEY,
    key     bytea NOT NULL
);
