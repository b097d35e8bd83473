"""Who may do what at the admin API and the console (pure; DESIGN.md §3.1).

People sign in through the team's OpenID Connect issuer (app/admin/oidc.py) and get a role from
their groups (``ORDERLY_ADMIN_ROLE_MAP``): ``viewer`` (every page and listing, no raw bodies),
``operator`` (also the actions and raw bodies), ``admin`` (also tokens). A console session is
server-side (app/admin/sessions.py): the cookie is a random id, nothing in it is signed with a
credential. The shared ``ORDERLY_ADMIN_TOKEN`` is break-glass: off unless set, an admin, audited
on every use. Flash messages carry a MAC keyed by a random server key (never a credential), so a
link cannot make a page say what the admin never said and a MAC seen in a URL reveals nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Literal

Role = Literal["viewer", "operator", "admin"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "admin")
SESSION_COOKIE = "orderly_session"
BREAK_GLASS = "break-glass"


RANK: dict[str, int] = {role: n for n, role in enumerate(ROLES)}


def rank(role: str) -> int:
    return RANK.get(role, -1)


def parse_role_map(text: str | None) -> dict[str, Role]:
    """``group=role,…`` (the setting's syntax is checked when it is read)."""
    found: dict[str, Role] = {}
    for pair in (text or "").split(","):
        group, _, role = pair.partition("=")
        if group.strip() and role.strip() in ROLES:
            found[group.strip()] = role.strip()  # type: ignore[assignment]
    return found


def role_of(groups: object, role_map: dict[str, Role]) -> Role | None:
    """The highest role any of the person's groups gives; None for none (a claim that is not a list
    of strings, or a single string, counts as what it holds)."""
    names = [groups] if isinstance(groups, str) else groups if isinstance(groups, list) else []
    roles: list[Role] = [role_map[g.lstrip("/")] for g in names if isinstance(g, str) and g.lstrip("/") in role_map]
    best: Role | None = None
    for role in roles:
        if best is None or RANK[role] > RANK[best]:
            best = role
    return best


# A raw body is the payload a gateway sent: personal data, so an operator's (DESIGN.md §3.1).
_RAW_BODY = re.compile(r"^/(api/)?quarantine/[^/]+$")


def required_role(method: str, path: str) -> Role:
    """The least role a request needs: tokens are an admin's, actions and raw bodies an operator's,
    every other page and listing a viewer's."""
    if path.startswith(("/api/tokens", "/tokens")):  # the API and the console's page alike
        return "admin"
    if path == "/logout":  # everyone may sign out
        return "viewer"
    if method not in ("GET", "HEAD") or _RAW_BODY.match(path):
        return "operator"
    return "viewer"


def digest(secret: str) -> str:
    """What is stored of a session id or a token: its SHA-256 (both are 256 random bits)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer(header: str | None) -> str | None:
    if not header or not header.startswith("Bearer "):
        return None
    return header[len("Bearer "):]


def token_ok(token: str | None, given: str | None) -> bool:
    """The break-glass token, compared in constant time; never matches when it is unset."""
    return bool(token) and given is not None and hmac.compare_digest(given.encode(), (token or "").encode())


def flash_mac(key: bytes, text: str) -> str:
    return hmac.new(key, f"flash:{text}".encode(), hashlib.sha256).hexdigest()[:32]


def flash_ok(key: bytes, text: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest((given or "").encode(), flash_mac(key, text).encode())


def csrf_ok(expected: str, given: str | None) -> bool:
    return bool(given) and hmac.compare_digest((given or "").encode(), expected.encode())


def trusted(text: str | None) -> list[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    return [ipaddress.ip_network(part.strip(), strict=False) for part in (text or "").split(",") if part.strip()]


def _in(address: str, networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in net for net in networks)


def source(remote: str | None, forwarded_for: str | None,
           proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> str:
    """The client's address: the peer, or behind trusted proxies the last address in
    ``X-Forwarded-For`` that is not one of them (what a client writes there itself is never believed)."""
    peer = remote or "?"
    if not proxies or not _in(peer, proxies) or not forwarded_for:
        return peer
    for hop in reversed([h.strip() for h in forwarded_for.split(",") if h.strip()]):
        if not _in(hop, proxies):
            return hop[:64]
    return peer


def secure(tls: bool, remote: str | None, forwarded_proto: str | None,
           proxies: list[ipaddress.IPv4Network | ipaddress.IPv6Network]) -> bool:
    """TLS directly, or a trusted proxy saying it took the request over TLS: cookies get ``Secure``."""
    return tls or (bool(proxies) and _in(remote or "", proxies) and (forwarded_proto or "").lower() == "https")


@dataclass
class LoginThrottle:
    """At most ``limit`` wrong credentials per ``window_s`` from one address, then 429 for wrong
    ones; a right credential is never refused (the caller checks it first). At most ``most``
    addresses are remembered, the least recently failing forgotten first."""

    limit: int = 10
    window_s: float = 60.0
    most: int = 10_000
    failures: OrderedDict[str, deque[float]] = field(default_factory=OrderedDict)

    def _recent(self, who: str, now: float) -> deque[float]:
        seen = self.failures.get(who, deque())
        while seen and seen[0] <= now - self.window_s:
            seen.popleft()
        return seen

    def allowed(self, who: str, now: float) -> bool:
        recent = self._recent(who, now)
        if not recent:
            self.failures.pop(who, None)  # the table does not grow with every address ever seen
        return len(recent) < self.limit

    def failed(self, who: str, now: float) -> None:
        seen = self._recent(who, now)
        seen.append(now)
        self.failures[who] = seen
        self.failures.move_to_end(who)
        while len(self.failures) > self.most:
            self.failures.popitem(last=False)
