"""The OpenAPI description of the webhook port's routes and of the effect deliveries Orderly sends (schema layer).

The ingest's routes (DESIGN.md §3) are served by `orderly ingest` on the webhook port, not where
the document is served: their path items name that server. The effect delivery (DESIGN.md §3.2)
is the request the merchant's endpoint receives, under the document's top-level ``webhooks``; the
end-to-end tests' merchant stub validates every delivery it gets against it (tests/pipeline.py).
"""

from __future__ import annotations

from app.admin import shapes
from app.admin.openapi_parts import Json, header, json_body, ok, operation, path_param, problems, ref
from app.gateways import registry
from topics.records import Effect
from topics.schemas import EFFECT_FIELDS, shape

INGEST_SERVER: Json = {
    "url": "{scheme}://{host}:{port}",
    "description": "the webhook port: `orderly ingest` (ORDERLY_INGEST_HOST, ORDERLY_INGEST_PORT), internet-facing",
    "variables": {"scheme": {"enum": ["https", "http"], "default": "https"},
                  "host": {"default": "127.0.0.1"}, "port": {"default": "8080"}}}
PUBLIC: list[Json] = []  # anyone may send; the body's signature is checked instead
INGEST = ["ingest"]

# Standard Webhooks (https://www.standardwebhooks.com): one or more space-separated signatures.
SIGNATURE = r"^v1,[A-Za-z0-9+/]+={0,2}( v1,[A-Za-z0-9+/]+={0,2})*$"


def webhook_path() -> Json:
    gateways = list(registry.GATEWAYS)
    stored = {"oneOf": [ref(shapes.Stored), ref(shapes.StoredQuarantined)]}
    return {"servers": [INGEST_SERVER], "post": operation(
        "receiveWebhook",
        "a gateway's webhook: verified on the raw body (each gateway's own signature scheme and headers), "
        "appended durably to orderly.raw before the answer",
        {**ok("stored durably, or quarantined when validly signed but unusable (adyen answers its own "
              "`[accepted]` instead)", stored),
         **problems(400, 401, 404, 408, 413, 415, 500, 503, why={
             400: "a malformed request body (e.g. a broken chunk)",
             401: "a missing or wrong signature, or a stale timestamp: nothing stored",
             404: "an unknown gateway, or one this ingest does not serve",
             408: "the body did not arrive within ORDERLY_READ_TIMEOUT_S",
             413: "a body over 1 MiB (checked before the signature)",
             415: "a Content-Encoding other than identity",
             503: "Kafka did not take the append in time: send it again"})},
        tags=INGEST, security=PUBLIC, parameters=[path_param("gateway", "the gateway", gateways)],
        body={"required": True, "description": "the gateway's event, byte for byte as it signed it",
              "content": {"application/json": {"schema": {}}}})}


def correlation_path() -> Json:
    deposit = path_param("deposit_id", "pg's deposit id")
    return {"servers": [INGEST_SERVER], "put": operation(
        "putCorrelation", "the merchant's correlation of a pg deposit: appended to orderly.raw under the "
        "deposit's key; the same body again is 200, a different one 409",
        {**ok("stored (or the same body again)", shapes.CorrelationStored),
         **problems(400, 401, 408, 409, 413, 415, 503, why={
             400: "a field that breaks the limits on ids and texts, named in detail",
             401: "a missing or wrong ORDERLY_API_TOKEN",
             409: "a different mapping is already stored for this deposit or reference",
             503: "Kafka or PostgreSQL away: send it again"})},
        tags=INGEST, security=[{"correlationToken": []}], parameters=[deposit],
        body=json_body(shapes.CorrelationRequest, "the merchant's ids for the deposit"))}


def ingest_paths() -> dict[str, Json]:
    return {
        "/webhooks/{gateway}": webhook_path(),
        "/correlations/pg/deposits/{deposit_id}": correlation_path(),
    }


def delivery_schema() -> Json:
    """The effect's JSON as the effects worker POSTs it (app/effects.py's ``request_body``), from the
    record type the worker writes to orderly.effects: exactly its fields."""
    schema = shape(Effect)
    for name, text in EFFECT_FIELDS.items():
        schema["properties"][name]["description"] = text
    schema["properties"]["gateway"] = {"type": "string", "enum": list(registry.GATEWAYS)}
    schema["properties"]["type"]["description"] = "the effect, e.g. credit_user, release_goods, mark_order_paid"
    schema["properties"]["resource_id"]["description"] = "the gateway's id of the resource it is about"
    schema["additionalProperties"] = False
    return schema


def webhooks() -> dict[str, Json]:
    """What Orderly sends the merchant (DESIGN.md §3.2): one signed POST per effect and attempt."""
    return {"effect": {"post": operation(
        "deliverEffect",
        "one business effect, POSTed to ORDERLY_EFFECTS_URL until the merchant answers 2xx; the same effect "
        "is sent again (same Idempotency-Key) after a failure or a lost answer, so the merchant dedupes on it",
        {"2XX": {"description": "taken: the effect is marked delivered and not sent again"},
         "default": {"description": "any other answer (or none within 10 s): retried with exponential backoff "
                                    "and jitter, dead after ORDERLY_EFFECTS_MAX_ATTEMPTS; redirects are not followed"}},
        tags=["effects"], security=PUBLIC,
        parameters=[
            header("Idempotency-Key", "the effect's dedupe key: the same effect always has the same key"),
            header("webhook-id", "Standard Webhooks message id: the dedupe key again"),
            header("webhook-timestamp", "Standard Webhooks: unix seconds when this attempt was signed",
                   {"type": "string", "pattern": "^[0-9]{1,12}$"}),
            header("webhook-signature",
                   "Standard Webhooks: `v1,<base64 HMAC-SHA256 of \"{webhook-id}.{webhook-timestamp}.{body}\">` "
                   "keyed with ORDERLY_EFFECTS_SECRET's base64 key (`whsec_…`)", {"type": "string",
                                                                                  "pattern": SIGNATURE}),
        ],  # and Content-Type: application/json (OpenAPI says it with the body's media type, not as a parameter)
        body={"required": True, "description": "the effect", "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/EffectDelivery"}}}})}}
