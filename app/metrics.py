"""Prometheus metrics of each process, in a registry of its own (so tests can run many apps)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

APPEND_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class IngestMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "orderly_ingest_requests", "Requests by gateway and outcome "
            "(stored, quarantined, unauthorized, too_large, unavailable, not_found, bad_request, conflict)",
            ["gateway", "outcome"], registry=self.registry)
        self.signature_failures = Counter(
            "orderly_ingest_signature_failures", "Deliveries refused with 401", ["gateway"],
            registry=self.registry)
        self.quarantined = Counter(
            "orderly_ingest_quarantined", "Validly signed bodies sent to quarantine", ["gateway", "reason"],
            registry=self.registry)
        self.append_seconds = Histogram(
            "orderly_ingest_append_seconds", "Time from send to Kafka acknowledgement (acks=all)",
            ["topic"], buckets=APPEND_BUCKETS, registry=self.registry)
        self.append_failures = Counter(
            "orderly_ingest_append_failures", "Appends that failed or passed the deadline (answered 503)",
            ["topic"], registry=self.registry)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
