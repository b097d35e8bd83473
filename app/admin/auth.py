"""Who may use the admin API and the console (pure; DESIGN.md §3.1).

One secret, ``ORDERLY_ADMIN_TOKEN``: the API takes it as ``Authorization: Bearer``; the console's
login page exchanges it for a session cookie. The session is stateless — ``expiry.nonce.mac``
with an HMAC keyed by the token — so it survives an admin restart, works across several admin
processes, and rotating the token ends every session. The CSRF token of a session is another HMAC
of the session, so a page can carry it and a POST without it is refused. Signing out records the
session's nonce (migration 0011), so a copied cookie is refused afterwards. The console's flash
messages travel in the redirect's query with a MAC of their own, so a link cannot make a page say
what the admin never said.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import deque
from dataclasses import dataclass, field

SESSION_COOKIE = "orderly_session"
SESSION_S = 12 * 3600


def _mac(token: str, purpose: str, message: str) -> str:
    return hmac.new(token.encode(), f"{purpose}:{message}".encode(), hashlib.sha256).hexdigest()


def bearer_ok(token: str, header: str | None) -> bool:
    """``Authorization: Bearer <token>``, compared in constant time."""
    if not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].encode(), token.encode())


def token_ok(token: str, given: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def new_session(token: str, now: float | None = None) -> str:
    expires = int((time.time() if now is None else now) + SESSION_S)
    body = f"{expires}.{secrets.token_urlsafe(12)}"
    return f"{body}.{_mac(token, 'session', body)}"


def session_ok(token: str, cookie: str | None, now: float | None = None) -> bool:
    if not cookie or cookie.count(".") != 2:
        return False
    body, _, mac = cookie.rpartition(".")
    expires = body.split(".", 1)[0]
    if not expires.isdigit() or len(expires) > 12:
        return False
    return (hmac.compare_digest(mac.encode(), _mac(token, "session", body).encode())
            and int(expires) > (time.time() if now is None else now))


def session_name(cookie: str) -> str:
    """The session's nonce: names the actor in the audit table without revealing the cookie."""
    return cookie.split(".")[1] if cookie.count(".") == 2 else "?"


def flash_mac(token: str, text: str) -> str:
    return _mac(token, "flash", text)[:32]


def flash_ok(token: str, text: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest((given or "").encode(), flash_mac(token, text).encode())


def csrf_token(token: str, cookie: str) -> str:
    return _mac(token, "csrf", cookie)


def csrf_ok(token: str, cookie: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest((given or "").encode(), csrf_token(token, cookie).encode())


@dataclass
class LoginThrottle:
    """At most ``limit`` wrong tokens per ``window_s`` from one address (console sign-ins and bearer
    tokens alike), then 429 for that address, the right token too, until the failures age out."""

    limit: int = 10
    window_s: float = 60.0
    failures: dict[str, deque[float]] = field(default_factory=dict)

    def _recent(self, who: str, now: float) -> deque[float]:
        seen = self.failures.setdefault(who, deque())
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        return seen

    def allowed(self, who: str, now: float) -> bool:
        recent = self._recent(who, now)
        if not recent:
            self.failures.pop(who, None)  # the table does not grow with every address ever seen
        return len(recent) < self.limit

    def failed(self, who: str, now: float) -> None:
        self._recent(who, now).append(now)
