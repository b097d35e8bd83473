"""OpenID Connect sign-in against the team's issuer: discovery, PKCE, the code exchange, ID token checks (I/O shell).

The authorization code flow with PKCE (S256), ``state`` and ``nonce`` (OpenID Connect Core 1.0
§3.1; RFC 7636). The issuer's discovery document and JSON Web Key Set are fetched with aiohttp
and kept; an ID token signed with a key id not in the set refetches it once (key rotation). The
ID token is checked with joserfc (signature with an algorithm the issuer announces, never
``none`` or an HMAC; ``iss`` exactly the configured issuer, ``aud`` holding the client id, ``azp``
when present, ``exp``, ``iat``, and the ``nonce`` sent). joserfc was chosen over authlib: the
flow is a few requests this module makes with the admin's own aiohttp, and joserfc is the JOSE
part alone (authlib's async clients are for httpx, and it pulls joserfc in anyway).
"""

from __future__ import annotations

import base64
import hashlib
import secrets
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote_plus, urlencode

import aiohttp
from joserfc import jwt
from joserfc.errors import InvalidKeyIdError, JoseError
from joserfc.jwk import KeySet

HTTP_DEADLINE_S = 10.0
LEEWAY_S = 60  # clocks of the admin and the issuer may differ this much
ASYMMETRIC = {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}


class SignInError(Exception):
    """A sign-in that cannot be completed; the message says why (shown to the person, audited)."""


@dataclass(frozen=True)
class Started:
    """What a sign-in sends to the issuer and must come back to: kept server-side under ``state``."""

    state: str
    nonce: str
    verifier: str
    url: str


def challenge(verifier: str) -> str:
    """PKCE S256: BASE64URL(SHA256(verifier)) without padding (RFC 7636 §4.2)."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()


def client_basic(client_id: str, secret: str) -> str:
    """``client_secret_basic``: id and secret each form-urlencoded, then HTTP Basic (RFC 6749 §2.3.1)."""
    pair = f"{quote_plus(client_id)}:{quote_plus(secret)}".encode()
    return "Basic " + base64.b64encode(pair).decode()


class Issuer:
    """One configured issuer: its discovery document and keys, fetched lazily and kept."""

    def __init__(self, issuer: str, client_id: str, client_secret: str | None, redirect_url: str) -> None:
        self.issuer, self.client_id = issuer.rstrip("/"), client_id
        self.client_secret, self.redirect_url = client_secret, redirect_url
        self._meta: dict[str, Any] | None = None
        self._keys: KeySet | None = None

    async def _get_json(self, http: aiohttp.ClientSession, url: str) -> Any:
        try:
            async with http.get(url, allow_redirects=False) as resp:
                if resp.status != 200:
                    raise SignInError(f"the issuer answered {resp.status} for {url}")
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise SignInError(f"the issuer is not reachable ({url}): {type(exc).__name__}") from exc

    def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=HTTP_DEADLINE_S))

    async def metadata(self) -> dict[str, Any]:
        if self._meta is None:
            async with self._session() as http:
                meta = await self._get_json(http, f"{self.issuer}/.well-known/openid-configuration")
            if not isinstance(meta, dict) or meta.get("issuer", "").rstrip("/") != self.issuer:
                raise SignInError("the discovery document names another issuer")
            for name in ("authorization_endpoint", "token_endpoint", "jwks_uri"):
                if not isinstance(meta.get(name), str):
                    raise SignInError(f"the discovery document has no {name}")
            self._meta = meta
        return self._meta

    async def keys(self, refresh: bool = False) -> KeySet:
        if self._keys is None or refresh:
            meta = await self.metadata()
            async with self._session() as http:
                raw = await self._get_json(http, meta["jwks_uri"])
            try:
                self._keys = KeySet.import_key_set(raw)
            except (JoseError, ValueError, TypeError, KeyError) as exc:
                raise SignInError(f"the issuer's key set is unusable: {exc}") from exc
        return self._keys

    async def start(self) -> Started:
        meta = await self.metadata()
        state, nonce, verifier = secrets.token_urlsafe(32), secrets.token_urlsafe(32), secrets.token_urlsafe(48)
        query = urlencode({"response_type": "code", "client_id": self.client_id, "redirect_uri": self.redirect_url,
                           "scope": "openid profile email", "state": state, "nonce": nonce,
                           "code_challenge": challenge(verifier), "code_challenge_method": "S256"})
        return Started(state, nonce, verifier, f"{meta['authorization_endpoint']}?{query}")

    async def end_session_url(self, id_token: str | None, post_logout_redirect_uri: str) -> str | None:
        """Where to send the browser so the issuer ends its own session too (OpenID Connect
        RP-Initiated Logout 1.0 §2), when its discovery document names an ``end_session_endpoint``;
        None when it names none or cannot be read (the console's session is ended either way)."""
        try:
            endpoint = (await self.metadata()).get("end_session_endpoint")
        except SignInError:
            return None
        if not isinstance(endpoint, str) or not endpoint.startswith(("https://", "http://")):
            return None
        query = {"client_id": self.client_id, "post_logout_redirect_uri": post_logout_redirect_uri,
                 **({"id_token_hint": id_token} if id_token else {})}
        return f"{endpoint}{'&' if '?' in endpoint else '?'}{urlencode(query)}"

    async def exchange(self, code: str, verifier: str) -> str:
        """The code for the ID token at the token endpoint (client secret in HTTP Basic)."""
        meta = await self.metadata()
        form = {"grant_type": "authorization_code", "code": code, "redirect_uri": self.redirect_url,
                "code_verifier": verifier, "client_id": self.client_id}
        headers = {"Authorization": client_basic(self.client_id, self.client_secret)} if self.client_secret else {}
        try:
            async with self._session() as http, http.post(meta["token_endpoint"], data=form, headers=headers,
                                                          allow_redirects=False) as resp:
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise SignInError(f"the token endpoint is not reachable: {type(exc).__name__}") from exc
        if resp.status != 200 or not isinstance(body, dict) or not isinstance(body.get("id_token"), str):
            error = body.get("error") if isinstance(body, dict) else None
            raise SignInError(f"the token endpoint refused the code ({resp.status} {error or ''})".strip())
        return str(body["id_token"])

    async def verify(self, id_token: str, nonce: str, now: float | None = None) -> dict[str, Any]:
        """The ID token's claims once its signature and claims are right; SignInError otherwise."""
        meta = await self.metadata()
        algorithms = [a for a in meta.get("id_token_signing_alg_values_supported", ["RS256"]) if a in ASYMMETRIC]
        keys = await self.keys()
        try:
            token = jwt.decode(id_token, keys, algorithms=algorithms)
        except InvalidKeyIdError:  # a key id not in the set: the issuer may have rotated its keys
            token = self._decode(id_token, await self.keys(refresh=True), algorithms)
        except JoseError as exc:
            raise SignInError(f"the ID token's signature is wrong: {exc.error}") from exc
        except ValueError as exc:  # not a JWT at all
            raise SignInError(f"the ID token is malformed: {type(exc).__name__}") from exc
        claims = token.claims
        registry = jwt.JWTClaimsRegistry(
            now=int(time.time() if now is None else now), leeway=LEEWAY_S,
            iss={"essential": True, "value": self.issuer}, aud={"essential": True, "value": self.client_id},
            sub={"essential": True}, exp={"essential": True}, iat={"essential": True},
            nonce={"essential": True, "value": nonce})
        try:
            registry.validate(claims)
        except JoseError as exc:
            raise SignInError(f"the ID token's claims are wrong: {exc.error} {exc.description or ''}".strip()) from exc
        audiences = claims["aud"] if isinstance(claims["aud"], list) else [claims["aud"]]
        if len(audiences) > 1 and claims.get("azp") != self.client_id:
            raise SignInError("the ID token is for several audiences and not authorised for this client")
        if "azp" in claims and claims["azp"] != self.client_id:
            raise SignInError("the ID token was issued to another client (azp)")
        return claims

    @staticmethod
    def _decode(id_token: str, keys: KeySet, algorithms: list[str]) -> jwt.Token:
        try:
            return jwt.decode(id_token, keys, algorithms=algorithms)
        except (JoseError, ValueError) as exc:
            raise SignInError(f"the ID token's signature is wrong: {type(exc).__name__}") from exc


def person(claims: dict[str, Any]) -> str:
    """How the audit names a person: the issuer's username, else the e-mail, else the subject."""
    for name in ("preferred_username", "email", "sub"):
        value = claims.get(name)
        if isinstance(value, str) and value.strip():
            return value.strip()[:200]
    return "?"
