"""The ingest process: store-then-acknowledge HTTP front door (I/O shell around the adapters).

A 2xx means Kafka acknowledged the append with acks=all from an idempotent producer. Between
receipt and append there is only the size check, the signature check and the resource key.

- ``app.ingest.app``: the aiohttp application, its wiring and the `orderly ingest` process
- ``app.ingest.receiver``: a signed webhook's way from its bytes to its answer
- ``app.ingest.correlations``: pg's correlation PUT and the PostgreSQL store that decides it
- ``app.ingest.appender``: the shared idempotent producer every append goes through
- ``app.ingest.readiness``: /healthz and /readyz
- ``app.ingest.body``: reading a request body within its size and time limits
- ``app.ingest.answers``, ``app.ingest.deliveries``: JSON answers, the 503 cause, delivery ids
"""
