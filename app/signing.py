"""Standard Webhooks signatures on the effects Orderly delivers to the merchant (pure layer).

The merchant verifies them with any Standard Webhooks library (https://www.standardwebhooks.com):
``webhook-signature: v1,<base64 HMAC-SHA256 of "{webhook-id}.{webhook-timestamp}.{body}">``, keyed
with the base64-decoded part of the ``whsec_…`` secret. No clock here: the timestamp is an argument.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

SECRET_PREFIX = "whsec_"


def signing_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_<base64>`` secret; an empty key is refused, since anyone can forge
    a signature made with it."""
    encoded = secret.removeprefix(SECRET_PREFIX)
    try:
        # padding is optional in the secrets other libraries print, so it is restored, not required
        key = base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not a {SECRET_PREFIX}<base64> secret: {exc}") from None
    if not key:
        raise ValueError("the signing key is empty")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: version 1, the only one Standard Webhooks defines for HMAC."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def signed_headers(key: bytes, msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    """The three Standard Webhooks headers for one delivery attempt of ``body``."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(key, msg_id, timestamp, body)}
