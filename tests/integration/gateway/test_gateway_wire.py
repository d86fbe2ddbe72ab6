"""The lean upstream client (gateway/upstream/wire.py) on real loopback sockets.

The gateway over ``WirePool`` must record and answer exactly what it does over httpx; the client
itself must frame bodies (Content-Length, chunked, read-to-close), reuse connections, survive a server
that closed an idle one, and never pool a connection it did not read to the end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from gateway.app import create_app
from gateway.errors import UpstreamTimeoutError
from gateway.server import GatewayServer
from gateway.settings import GatewaySettings
from gateway.upstream.client import UpstreamPool, make_upstream
from gateway.upstream.wire import WirePool
from infra.bus.memory import MemoryBus
from schemas import EPISODES, LLMCallRecorded, new_episode_id
from tests.fakes.events import Collector
from tests.fakes.upstream import FakeUpstreamConfig, create_fake_upstream

pytestmark = pytest.mark.timeout(30)

MSGS = [{"role": "user", "content": "hi"}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]


@asynccontextmanager
async def _fake_upstream() -> AsyncIterator[str]:
    server = GatewayServer(create_fake_upstream(FakeUpstreamConfig(keep_requests=False)), port=0)
    url = await server.start()
    try:
        yield f"{url}/v1"
    finally:
        await server.stop()


@asynccontextmanager
async def _gateway(
    tmp: Path, upstream_url: str, *, wire: bool
) -> AsyncIterator[tuple[httpx.AsyncClient, Collector]]:
    bus = MemoryBus()
    await bus.start()
    settings = GatewaySettings(data_dir=tmp, admin_token="a", gateway_id=f"gw-{wire}")
    upstream = make_upstream(upstream_url, timeout_s=5.0, wire=wire)
    assert (upstream.wire is not None) is wire
    app = create_app(settings, bus, [upstream], lifespan=False)
    events = await Collector().attach(bus, EPISODES)
    await app.state.gateway.start()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw", timeout=10)
    try:
        yield client, events
    finally:
        await client.aclose()
        await app.state.gateway.stop()
        await events.stop()
        await bus.stop()


def _normalised(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def _sse_payloads(text: str) -> list[Any]:
    out = []
    for line in text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(_normalised(orjson.loads(line[6:])))
    return out


def _call_number(seq: int) -> Callable[[Any], bool]:
    return lambda e: isinstance(e, LLMCallRecorded) and e.call_seq == seq


CASES: list[tuple[str, dict[str, Any]]] = [
    ("chat/completions", {"model": "m", "messages": MSGS}),
    ("chat/completions", {"model": "m", "messages": MSGS, "logprobs": True, "top_logprobs": 2, "n": 2}),
    ("chat/completions", {"model": "m", "messages": MSGS, "tools": TOOLS}),
    ("chat/completions", {"model": "m", "messages": MSGS, "stream": True}),
    ("chat/completions", {"model": "m", "messages": MSGS, "stream": True, "tools": TOOLS}),
    ("completions", {"model": "m", "prompt": "2+2=", "logprobs": 1}),
    ("completions", {"model": "m", "prompt": "2+2=", "stream": True}),
]


async def test_gateway_over_wire_answers_and_records_what_httpx_does(tmp_path: Path) -> None:
    async with _fake_upstream() as url:
        seen: dict[bool, list[tuple[Any, LLMCallRecorded]]] = {}
        for wire in (True, False):
            async with _gateway(tmp_path / str(wire), url, wire=wire) as (client, events):
                episode_id = new_episode_id()
                r = await client.post(
                    "/admin/episodes", json={"episode_id": episode_id}, headers={"Authorization": "Bearer a"}
                )
                assert r.status_code == 201, r.text
                got = []
                for i, (path, body) in enumerate(CASES):
                    r = await client.post(f"/episodes/{episode_id}/v1/{path}", json=body)
                    assert r.status_code == 200, r.text
                    shown = _sse_payloads(r.text) if body.get("stream") else _normalised(r.json())
                    if body.get("stream"):
                        assert r.text.endswith("data: [DONE]\n\n")
                    (call,) = await events.wait_for(_call_number(i))
                    got.append((shown, call))
                seen[wire] = got
        for (shown_w, call_w), (shown_h, call_h) in zip(seen[True], seen[False], strict=True):
            assert shown_w == shown_h
            assert call_w.token_faithful and call_w.token_faithful == call_h.token_faithful
            assert call_w.prompt_token_ids == call_h.prompt_token_ids
            assert call_w.choices == call_h.choices
            assert call_w.request == call_h.request
            assert call_w.response is not None and call_h.response is not None
            assert _normalised(orjson.loads(call_w.response)) == _normalised(orjson.loads(call_h.response))
            assert call_w.weight_version == call_h.weight_version


# ------------------------------------------------------------------------------- the client alone
Serve = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _raw_server(serve: Serve) -> AsyncIterator[str]:
    handlers: set[asyncio.Task[None]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handlers.add(asyncio.current_task())  # type: ignore[arg-type]
        try:
            await serve(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/v1/"
    finally:
        server.close()
        for task in handlers:
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length")
    )
    return await reader.readexactly(length)


async def test_chunked_with_trailers_and_read_to_close_bodies() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        body = await _read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"a\r\ndata: a\nda\r\n6;ext=1\r\nta: b\r\r\n8\r\n\ndata: c\r\n0\r\nX-Trailer: t\r\n\r\n"
        )
        body = await _read_request(reader)  # the same connection again
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"8\r\ndata: a\n\r\n8\r\ndata: b\n\r\n0\r\n\r\n"
        )
        body = await _read_request(reader)
        writer.write(b"HTTP/1.0 200 OK\r\n\r\n" + body)
        await writer.drain()
        writer.close()

    async with _raw_server(serve) as url:
        pool = WirePool(url)
        r = await pool.post("x", b"{}", stream=True)
        assert [line async for line in r.aiter_lines()] == ["data: a", "data: b", "data: c"]
        await r.aclose()
        assert len(pool._idle) == 1  # read to its end: reusable
        r = await pool.post("x", b"{}", stream=True)
        async for line in r.aiter_lines():
            assert line == "data: a"
            break  # as the gateway leaves a stream at [DONE]
        await r.aclose()
        assert len(pool._idle) == 1  # the rest was on the wire: drained, pooled again
        r = await pool.post("x", b'{"k": 1}', stream=False)
        assert r.status_code == 200 and r.content == b'{"k": 1}'
        assert pool._idle == []  # HTTP/1.0, body to close: not reusable
        await pool.aclose()


async def test_a_stream_closed_under_cancellation_still_closes_its_connection() -> None:
    """An agent hanging up mid-stream cancels the gateway's handler; ``aclose`` in its cleanup is cancelled
    too, and must still close the connection rather than leave it open and out of the pool."""
    release = asyncio.Event()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata: a\n\r\n")
        await writer.drain()
        await release.wait()  # the terminator comes late: aclose() is waiting in its drain

    async with _raw_server(serve) as url:
        pool = WirePool(url)
        r = await pool.post("x", b"{}", stream=True)
        async for line in r.aiter_lines():
            assert line == "data: a"
            break
        conn = r._conn
        assert conn is not None
        closing = asyncio.create_task(r.aclose())
        await asyncio.sleep(0.01)  # inside the drain
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
        release.set()
        assert conn[1].is_closing() and pool._idle == []
        await pool.aclose()


async def test_reused_connection_closed_by_the_server_is_replaced() -> None:
    connections = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # keep-alive promised, then the server drops it (as an idle timeout does)

    async with _raw_server(serve) as url:
        pool = WirePool(url)
        for _ in range(3):
            r = await pool.post("x", b"{}", stream=False)
            assert r.content == b"ok"
            await asyncio.sleep(0.05)
        assert connections == 3
        await pool.aclose()


async def test_refused_and_abandoned_connections() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(10)  # never finishes the body

    async with _raw_server(serve) as url:
        pool = WirePool(url, read_timeout_s=0.2)
        r = await pool.post("x", b"{}", stream=True)
        with pytest.raises(httpx.ReadTimeout):
            async for _ in r.aiter_lines():
                pass
        await r.aclose()
        assert pool._idle == []
        up = make_upstream(url, timeout_s=0.3)
        with pytest.raises(UpstreamTimeoutError):
            await UpstreamPool([up], retries=0).send(up, "x", b"{}", stream=False)
        assert up.wire is not None and up.wire._idle == []
        await up.wire.aclose()
        await pool.aclose()
    with pytest.raises(httpx.ConnectError):
        await WirePool(url).post("x", b"{}", stream=False)


async def test_requests_beyond_max_connections_wait_for_a_free_one() -> None:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await _read_request(reader)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()

    async with _raw_server(serve) as url:
        pool = WirePool(url, max_connections=1)
        first = await pool.post("x", b"{}", stream=True)  # holds the only slot until it is closed
        second = asyncio.create_task(pool.post("x", b"{}", stream=False))
        await asyncio.sleep(0.1)
        assert not second.done()
        assert await first.aread() == b"ok"  # read to its end: the slot and the connection are free
        assert (await asyncio.wait_for(second, 5)).content == b"ok"
        await pool.aclose()
