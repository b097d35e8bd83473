"""The typed answers of the admin API and the ingest, as the OpenAPI document publishes them (schema layer).

Each answer's JSON shape is a msgspec Struct here; app/admin/openapi.py generates the document's
component schemas from them (``msgspec.json.schema_components``), so a shape is written once. Every
Struct forbids unknown fields, which the generated schema says as ``additionalProperties: false``:
the end-to-end tests validate every answer they get against the document (tests/openapi_check.py),
so a handler that adds, drops or retypes a field fails there until its shape here says so.
Datetimes are RFC 3339 strings on the wire (orjson writes them so); amounts are integer minor units,
or decimal strings where a state holds NUMERIC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import msgspec

Role = Literal["viewer", "operator", "admin"]
Outcome = Literal["applied", "stale", "duplicate", "parked", "unparked", "quarantined", "synced"]
EffectStatus = Literal["pending", "dead", "delivered"]
# A header as [name, value]: a list of two, not a tuple, whose schema (prefixItems) schemathesis 4.32
# mishandles, so the fuzzing of the admin API would stop at it.
Pair = Annotated[list[str], msgspec.Meta(min_length=2, max_length=2)]


class Shape(msgspec.Struct, forbid_unknown_fields=True):
    """An answer's JSON object: exactly these fields."""


class Problem(Shape):
    """A refusal, as an RFC 9457 problem document (app/problem.py)."""

    type: str
    title: str
    status: int
    detail: str
    error: str  # the same text as detail: what these answers carried before (``{"error": …}``)


# --- the admin API -------------------------------------------------------------------------------

class BulkOutcome(Shape):
    """A bulk retry or redrive by filter (app/admin/bulk.py): ``matched`` now, ``acted`` on."""

    action: str
    target: str
    matched: int
    acted: int
    refused: int
    dry_run: bool
    result: str
    most_per_call: int


class Done(Shape):
    """An audited action's result: what was done, to what, and how it ended."""

    action: str
    target: str
    result: str


class Deliveries(Shape):
    total: dict[str, int]  # deliveries by outcome
    last_hour: dict[str, int]


class ConsumerLag(Shape):
    group: str
    topic: str
    lag: int
    store: Literal["kafka", "postgresql"]


class Overview(Shape):
    deliveries: Deliveries
    parked: int  # resources holding parked deliveries
    open_gaps: int
    quarantined: int  # set aside and not redriven
    quarantined_total: int
    effects_pending: int
    effects_dead: int
    effects_delivered: int
    consumer_lag: list[ConsumerLag]
    lag_error: str | None  # why the lag is not measured (Kafka away): the failure's kind, the log has its text; or null
    projector_lag: int | None
    counted_at: datetime  # when the count began reading (PostgreSQL's clock; one count for every reader)
    counting_s: float  # how long reading them took
    count_error: str | None  # why the last count failed, when these counts are older than it; else null


class ResourceEffect(Shape):
    """An effect a resource's applied transition emitted, with its delivery status."""

    dedupe_key: str
    type: str
    payload: dict[str, Any]
    caused_by: str
    created_at: datetime
    delivered_at: datetime | None
    attempts: int
    last_error: str | None
    dead_at: datetime | None
    next_attempt_at: datetime | None
    status: EffectStatus


class TimelineEntry(Shape):
    """One delivery of a resource with its latest outcome, in arrival order, and the gateway's own
    ordering fields read from its body."""

    delivery_id: str
    event_id: str | None
    event_type: str | None
    received_at: datetime | None
    outcome: Outcome
    why: str | None
    seq: int | None
    gateway_time: str | None
    version: str | None
    sequence: str | None
    payload: Any  # the event as the gateway sent it (null for a record the ingest set aside)
    effects: list[ResourceEffect]
    arrival: int  # 1-based position in arrival order
    gateway_position: int | None  # 1-based position in the gateway's order; null without ordering fields
    late: bool  # arrived after a delivery the gateway placed after it (app/admin/timeline.py)


class Resource(Shape):
    gateway: str
    resource_id: str
    state: dict[str, Any] | None  # the read-model row with its ``kind``; null when only set-aside records exist
    parked: int
    order: Literal["arrival", "gateway"]  # the timeline's order, as asked
    late: int  # deliveries that arrived after one the gateway placed after them
    timeline: list[TimelineEntry]
    effects: list[ResourceEffect]


class ResourceSummary(Shape):
    gateway: str
    resource_id: str
    last_at: datetime
    deliveries: int
    parked: int
    kind: str | None
    status: str | None


class ResourcePage(Shape):
    items: list[ResourceSummary]
    match: Literal["whole", "part"] | None  # how q matched: a whole id's resources, or the ids holding it; null: no q
    next_cursor: str | None  # null: no more


class ParkedResource(Shape):
    gateway: str
    resource_id: str
    deliveries: int
    parked_since: datetime
    why: str
    first_event_type: str | None
    overdue: bool


class ParkedList(Shape):
    items: list[ParkedResource]


class Gap(Shape):
    merchant: str
    start_seq: int
    end_seq: int
    missing: int
    first_seen_at: datetime
    age_s: int
    backfill_requested_at: datetime | None
    backfill: str


class GapList(Shape):
    items: list[Gap]


class QuarantineEntry(Shape):
    delivery_id: str
    gateway: str | None
    resource_id: str | None
    stage: str
    reason: str
    received_at: datetime | None
    quarantined_at: datetime
    redriven_at: datetime | None
    redrives: int
    bytes: int


class QuarantineList(Shape):
    items: list[QuarantineEntry]


class QuarantinedRecord(Shape):
    """One set-aside record with its headers (name, value pairs) and its body as text."""

    delivery_id: str
    gateway: str | None
    resource_id: str | None
    stage: str
    reason: str
    received_at: datetime | None
    quarantined_at: datetime
    topic: str | None
    headers: list[Pair]
    body: str
    body_bytes: int
    redriven_at: datetime | None
    redrives: int


class EffectEntry(Shape):
    dedupe_key: str
    type: str
    gateway: str
    resource_id: str
    caused_by: str
    created_at: datetime
    delivered_at: datetime | None
    dead_at: datetime | None
    attempts: int
    last_error: str | None
    next_attempt_at: datetime | None
    status: EffectStatus


class EffectList(Shape):
    items: list[EffectEntry]


class AuditEntry(Shape):
    id: int
    at: datetime
    actor: str  # person@address
    action: str
    target: str
    result: str


class AuditList(Shape):
    items: list[AuditEntry]


class Me(Shape):
    person: str
    role: Role
    via: str  # oidc, break-glass, or token:<name> for a personal API token
    source: str  # the client's address


class Token(Shape):
    """A personal API token as listed: never the token itself."""

    id: int
    name: str
    owner: str
    role: Role
    created_at: datetime
    expires_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenList(Shape):
    items: list[Token]


class TokenCreated(Shape):
    """A new personal API token: ``token`` is shown this once."""

    id: int
    name: str
    owner: str
    role: Role
    created_at: datetime
    expires_at: datetime
    token: str


class TokenRequest(Shape):
    name: str
    role: Role
    expires_days: int = 30


class Revoked(Shape):
    id: int
    revoked: bool


class Health(Shape):
    status: Literal["ok"]


# --- the ingest (the webhook port) ---------------------------------------------------------------

class Stored(Shape):
    """A webhook appended durably to orderly.raw."""

    status: Literal["stored"]
    delivery_id: str


class StoredQuarantined(Shape):
    """A validly signed webhook that cannot be used (not JSON, an unknown type, a field out of
    bounds): stored in quarantine, answered 200 so the gateway does not resend it."""

    status: Literal["stored"]
    quarantined: Literal[True]
    reason: str
    delivery_id: str


class CorrelationStored(Shape):
    status: Literal["stored"]


class CorrelationRequest(Shape):
    merchant_reference: str
    our_order_id: str
    our_user_id: str


class ReadinessErrors(Shape):
    kafka: str | None = None
    postgres: str | None = None


class Readiness(Shape):
    """Kafka and PostgreSQL answering now; ``errors`` names what did not (only on 503)."""

    kafka: bool
    postgres: bool
    errors: ReadinessErrors | None = None


class Waiting(Shape):
    """What a process waits for (app/readiness.py): the error that made it wait, and since how long."""

    reason: str
    for_s: float


class ProcessReadiness(Shape):
    """The admin's /readyz (and, on their metrics bind, the projector's, effects' and fetcher's)."""

    ready: bool
    waiting_for: dict[str, Waiting] | None = None


ANSWERS: tuple[type[Shape], ...] = (
    Problem, Done, BulkOutcome, Overview, Resource, ResourcePage, ParkedList, GapList, QuarantineList,
    QuarantinedRecord, EffectList, AuditList, Me, TokenList, TokenCreated, TokenRequest, Revoked, Health, Stored,
    StoredQuarantined, CorrelationStored, CorrelationRequest, Readiness, ProcessReadiness,
)
