"""RFC 9457 problem documents: the body of every refusal the ingest and the admin API answer (pure layer).

``{"type", "title", "status", "detail"}`` as RFC 9457 §3.1 defines them, sent as
``application/problem+json``. ``type`` is ``about:blank`` (§4.2.1): the status says what kind of
problem it is, ``detail`` says what was wrong with this request. The extension member ``error``
(§3.2 allows extensions) repeats ``detail``: it is what these answers carried before they were
problem documents (``{"error": …}``), kept so a client that reads it goes on working.
"""

from __future__ import annotations

from http import HTTPStatus

import orjson

CONTENT_TYPE = "application/problem+json"
BLANK = "about:blank"


def title(status: int) -> str:
    """The status's reason phrase, as RFC 9457 §4.2.1 asks for ``about:blank`` problems."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def problem(status: int, detail: str) -> dict[str, str | int]:
    return {"type": BLANK, "title": title(status), "status": status, "detail": detail, "error": detail}


def problem_bytes(status: int, detail: str) -> bytes:
    return orjson.dumps(problem(status, detail))
