"""The door to aiokafka 0.14.0's group requests that it lacks: removing another member from a
consumer group (seam layer; its private state and patches: app/seams/aiokafka.py).

aiokafka sends LeaveGroup versions 0 and 1 only, with which a member can only leave by itself.
Version 3 (KIP-345) names the members to remove, each by its member id and, for a static member,
its group instance id: what Kafka's Admin.removeMembersFromConsumerGroup sends. The request is built
from aiokafka's protocol classes (protocol/api.py Request, RequestStruct, Response; protocol/types.py)
and sent with its client's public coordinator_lookup and send (client.py).
"""

from __future__ import annotations

from typing import Any

from aiokafka import errors as Errors
from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID = 25, 82
# what a broker without LeaveGroup version 3 (before Kafka 2.4) makes the request raise
UNSUPPORTED = (Errors.IncompatibleBrokerVersion, Errors.UnsupportedVersionError)


class LeaveGroupResponse_v3(Response):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")),
                          ("error_code", Int16))),
    )


class LeaveGroupRequest_v3(RequestStruct):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class RemoveMembersRequest(Request[LeaveGroupRequest_v3]):  # type: ignore[misc]  # aiokafka's protocol classes are untyped
    """LeaveGroup version 3: members of a group removed by another client."""

    API_KEY = 13

    def __init__(self, group_id: str, members: list[tuple[str, str | None]]) -> None:
        self._fields: tuple[Any, ...] = (group_id, members)

    def build(self, request_struct_class: type[LeaveGroupRequest_v3]) -> LeaveGroupRequest_v3:
        return request_struct_class(*self._fields)


async def remove_members(client: AIOKafkaClient, group_id: str,
                         members: list[tuple[str, str | None]]) -> dict[tuple[str, str | None], int]:
    """Has ``group_id``'s coordinator remove ``members`` ((member id, instance id or None) each);
    the error code of each (0: removed, 25 UNKNOWN_MEMBER_ID: not a member, 82 FENCED_INSTANCE_ID:
    the instance is in the group under another member id). A removal is a rebalance of the group:
    its other members hear of it at their next heartbeat. ``client`` is started (any aiokafka
    client's); client.py AIOKafkaClient.coordinator_lookup and send are public methods."""
    node = await client.coordinator_lookup(CoordinationType.GROUP, group_id)
    answer = await client.send(node, RemoveMembersRequest(group_id, members))
    if answer.error_code:
        raise Errors.for_code(answer.error_code)(f"LeaveGroup of {group_id}")
    return {(member, instance): error for member, instance, error in answer.members}
