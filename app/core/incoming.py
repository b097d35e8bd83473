"""A consumed record of orderly.raw and what its headers say: its Delivery, whether it is a
merchant's correlation, and how the ingest checked its body (pure layer; the worker, replay and the
simulation check read records through it).
"""

from __future__ import annotations

import msgspec

from app.core.model import Delivery
from topics import records as headers_read
from topics.records import CHECKED_VALUE, CORRELATION, H_CHECKED, H_RECORD


# The worker builds one per consumed record. A msgspec Struct is built in C (a NamedTuple's __new__
# is a Python function), and gc=False keeps a batch of them out of the cyclic collector's passes:
# safe, as an Incoming holds bytes, ints, a str and a list of header tuples, none of which can
# refer back to it.
class Incoming(msgspec.Struct, frozen=True, gc=False):
    """One consumed record of orderly.raw."""

    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    offset: int
    partition: int
    topic: str


# How the ingest checked a record (its ``checked`` header): not at all, by its adapter's schema (an
# earlier release's "1"), or also as JSON every reader of the log reads (CHECKED_VALUE).
NOT_CHECKED, TAKEN, SOUND = 0, 1, 2
_CHECKED_TEXT = CHECKED_VALUE.decode()


def checked_as(value: str | None) -> int:
    """NOT_CHECKED, TAKEN or SOUND, for a ``checked`` header's text."""
    return SOUND if value == _CHECKED_TEXT else TAKEN if value == "1" else NOT_CHECKED


def delivery_of(resource_key: str, headers: dict[str, str], topic: str, offset: int, partition: int,
                strict: bool = True) -> Delivery:
    """The Delivery of a record's decoded headers (``strict=False``: a received_at that is no time is 0)."""
    get = headers.get
    text = get("received_at") or ""
    received = headers_read.received_ms(text) if strict else headers_read.received_ms_or_none(text) or 0
    return Delivery(get("delivery_id") or headers_read.log_place(topic, partition, offset),
                    get("gateway") or resource_key.partition(":")[0], resource_key,
                    received, offset, get("source", "webhook"))


def read_headers(record: Incoming) -> tuple[Delivery, bool, int]:
    """What :func:`decide_record` reads of a record's headers (its Delivery, whether it is a
    correlation, how the ingest checked it: :func:`checked_as`), without a dict of them: about 6 k instructions
    less per record. It fails where that dict would have (a value that is not UTF-8: the careful
    pass takes the batch then), and the same header given twice counts as the last, as there.

    The headers the ingest writes, in its order (``raw_headers`` then ``checked``), are taken
    apart in one unpacking: the same result as the loop below for them, at a third of its cost."""
    headers = record.headers
    if len(headers) == 5:
        (n1, gateway_b), (n2, delivery_b), (n3, received_b), (n4, source_b), (n5, checked_b) = headers
        if n1 == "gateway" and n2 == "delivery_id" and n3 == "received_at" and n4 == "source" and \
                n5 == H_CHECKED and checked_b == CHECKED_VALUE:
            # the ingest's source compared as bytes, its number read from them (int() takes ASCII
            # digits in bytes as in a str); every other value decoded before the number, as the loop
            # fails first on those
            named, delivered = gateway_b.decode(), delivery_b.decode()
            sent_by = "webhook" if source_b == b"webhook" else source_b.decode()
            resource_key = record.key.decode()
            try:
                at = int(received_b) if received_b else 0
            except ValueError:  # digits int() takes only in a str (١٢٣), or the str's own failure
                at = int(received_b.decode())
            if not 0 <= at <= headers_read.RECEIVED_MAX:
                headers_read.received_ms(received_b)  # raises, with the reason
            return Delivery(delivered or headers_read.log_place(record.topic, record.partition, record.offset),
                            named or resource_key.partition(":")[0], resource_key,
                            at, record.offset, sent_by), False, SOUND
    delivery_id = gateway = received = None
    source, correlation, checked = "webhook", False, NOT_CHECKED
    for name, value in headers:
        if name == "delivery_id":
            delivery_id = value.decode()
        elif name == "received_at":
            received = value.decode()
        elif name == "gateway":
            gateway = value.decode()
        elif name == "source":
            source = value.decode()
        elif name == H_CHECKED:
            checked = checked_as(value.decode())  # a value that is not UTF-8 fails here, as it did in the dict
        else:
            text = value.decode()
            if name == H_RECORD:
                correlation = text == CORRELATION
    resource_key = record.key.decode()
    return Delivery(delivery_id or headers_read.log_place(record.topic, record.partition, record.offset),
                    gateway or resource_key.partition(":")[0], resource_key,
                    headers_read.received_ms(received) if received else 0, record.offset, source), correlation, checked
