"""The admin's identity settings: OpenID Connect, roles, sessions, break-glass (configuration layer).

Declared here and bound to attributes of :class:`app.settings.Settings` (whose module would
otherwise outgrow its size); DESIGN.md §3.1 and docs/security.md say what they do.
"""

from __future__ import annotations

from app.setting_kinds import Hidden, Integer, Maybe, Setting, Text

admin_token = Setting("ORDERLY_ADMIN_TOKEN", Maybe(Hidden(Text())),
        None, "break-glass bearer token of the admin API and console (unset: off); every use is audited as "
        "`break-glass` and the console shows a banner; keep it apart from the correlation token "
        "(`orderly dev`: random per stack)")
admin_oidc_issuer = Setting("ORDERLY_ADMIN_OIDC_ISSUER", Maybe(Text(r"https?://\S+", "an issuer URL")), None,
        "OpenID Connect issuer of the console's sign-in (its discovery document is "
        "`<issuer>/.well-known/openid-configuration`); unset: break-glass only")
admin_oidc_client_id = Setting("ORDERLY_ADMIN_OIDC_CLIENT_ID", Maybe(Text()), None,
        "the admin's client id at the issuer (required with the issuer)")
admin_oidc_client_secret = Setting("ORDERLY_ADMIN_OIDC_CLIENT_SECRET", Maybe(Hidden(Text())), None,
        "the admin's client secret at the issuer (a confidential client; PKCE is used as well)")
admin_oidc_redirect_url = Setting("ORDERLY_ADMIN_OIDC_REDIRECT_URL", Maybe(Text(r"https?://\S+", "a URL")), None,
        "where the issuer sends the browser back: `<admin URL>/auth/callback` (required with the issuer)")
admin_roles_claim = Setting("ORDERLY_ADMIN_ROLES_CLAIM", Text(r"[^\s]+", "a claim name"), "groups",
        "ID token claim holding the person's groups")
admin_role_map = Setting("ORDERLY_ADMIN_ROLE_MAP", Maybe(Text(r"[^=,\s][^=,]*=(viewer|operator|admin)"
                                                      r"(,[^=,\s][^=,]*=(viewer|operator|admin))*",
                                                      "`group=role,…` with roles viewer, operator, admin")), None,
        "which group gives which role; a person in several gets the highest; in none: refused")
admin_session_idle_s = Setting("ORDERLY_ADMIN_SESSION_IDLE_S", Integer(minimum=1), 900,
        "a console session unused this long (seconds) is ended")
admin_session_max_s = Setting("ORDERLY_ADMIN_SESSION_MAX_S", Integer(minimum=1), 43200,
        "a console session ends this long (seconds) after sign-in, used or not")
admin_trusted_proxies = Setting("ORDERLY_ADMIN_TRUSTED_PROXIES",
        Maybe(Text(r"[0-9a-fA-F.:/]+(,[0-9a-fA-F.:/]+)*", "addresses or CIDRs, comma-separated")), None,
        "proxies in front of the admin whose `X-Forwarded-For` / `X-Forwarded-Proto` are believed "
        "(the source address audited, `Secure` cookies behind TLS)")

IDENTITY = (admin_token, admin_oidc_issuer, admin_oidc_client_id, admin_oidc_client_secret, admin_oidc_redirect_url,
            admin_roles_claim, admin_role_map, admin_session_idle_s, admin_session_max_s, admin_trusted_proxies)
