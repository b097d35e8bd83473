"""app/ingest/body.py's read_body: a body that arrived with its headers is taken without a timer; one
still arriving is read within the deadline; either way at most the limit."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp import streams
from aiohttp.test_utils import make_mocked_request

from app.ingest.body import BodyRefused, read_body


def request_with(chunks: list[bytes], eof: bool, length: int | None = None) -> tuple[object, streams.StreamReader]:
    content = streams.StreamReader(mock.Mock(_reading_paused=False), 2 ** 16, loop=asyncio.get_running_loop())
    for chunk in chunks:
        content.feed_data(chunk)
    if eof:
        content.feed_eof()
    headers = {"Content-Length": str(length)} if length is not None else {}
    return make_mocked_request("POST", "/webhooks/pg", headers=headers, payload=content), content


def test_a_body_already_arrived_is_returned_whole() -> None:
    async def scenario() -> bytes:
        request, _ = request_with([b'{"a":', b" 1}"], eof=True, length=8)
        return await read_body(request, 100, 5.0)  # type: ignore[arg-type]

    assert asyncio.run(scenario()) == b'{"a": 1}'


def test_an_empty_body_is_empty() -> None:
    async def scenario() -> bytes:
        request, _ = request_with([], eof=True)
        return await read_body(request, 100, 5.0)  # type: ignore[arg-type]

    assert asyncio.run(scenario()) == b""


def test_a_body_over_the_limit_is_refused_arrived_or_not() -> None:
    async def scenario(eof: bool) -> int:
        request, content = request_with([b"x" * 60, b"y" * 60], eof=eof)  # chunked: no length announced
        if not eof:
            asyncio.get_running_loop().call_later(0.01, content.feed_eof)
        with pytest.raises(BodyRefused) as refused:
            await read_body(request, 100, 5.0)  # type: ignore[arg-type]
        return refused.value.status

    assert asyncio.run(scenario(True)) == 413
    assert asyncio.run(scenario(False)) == 413


def test_a_body_still_arriving_is_waited_for_within_the_deadline() -> None:
    async def scenario() -> bytes:
        request, content = request_with([b"first "], eof=False)
        loop = asyncio.get_running_loop()
        loop.call_later(0.01, content.feed_data, b"second")
        loop.call_later(0.02, content.feed_eof)
        return await read_body(request, 100, 5.0)  # type: ignore[arg-type]

    assert asyncio.run(scenario()) == b"first second"


def test_a_body_that_never_completes_is_a_408() -> None:
    async def scenario() -> int:
        request, _ = request_with([b"part"], eof=False, length=100)
        with pytest.raises(BodyRefused) as refused:
            await read_body(request, 1000, 0.05)  # type: ignore[arg-type]
        return refused.value.status

    assert asyncio.run(scenario()) == 408
