"""The LLM-call routes served ahead of FastAPI (gateway.app.HotCalls) answer exactly as the FastAPI
routes do, and ``gateway.server.run`` hosts a gateway on uvloop when it is installed."""

from __future__ import annotations

import asyncio
import importlib.util
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.types import Message

from gateway.server import run
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = pytest.mark.timeout(30)

MSGS = [{"role": "user", "content": "hi"}]


async def _both(h: GatewayHarness, path: str, **kwargs: Any) -> tuple[Any, Any]:
    """The same request through the hot path and through FastAPI's own routes."""
    hot = await h.client.post(path, **kwargs)
    saved, h.app.hot = h.app.hot, None  # type: ignore[attr-defined]
    try:
        routed = await h.client.post(path, **kwargs)
    finally:
        h.app.hot = saved  # type: ignore[attr-defined]
    return hot, routed


async def test_hot_path_answers_as_the_fastapi_routes_do(tmp_path: Path) -> None:
    async with GatewayHarness(tmp_path) as h:
        assert h.app.hot is not None  # type: ignore[attr-defined]
        ep = await h.open_episode()
        _, key = h.keystore.create("acme")
        cases: list[tuple[str, dict[str, Any]]] = [
            (f"/episodes/{ep}/v1/chat/completions", {"json": {"messages": MSGS}}),
            (f"/episodes/{ep}/v1/completions", {"json": {"prompt": "hi", "max_tokens": 4}}),
            (f"/episodes/{ep}/v1/chat/completions", {"content": b"{not json"}),
            (f"/episodes/{ep}/v1/chat/completions", {"json": {"messages": []}}),
            (f"/episodes/{'0' * 32}/v1/chat/completions", {"json": {"messages": MSGS}}),
            ("/v1/chat/completions", {"json": {"messages": MSGS}}),
            (
                "/v1/chat/completions",
                {"json": {"messages": MSGS}, "headers": {"Authorization": "Bearer nope"}},
            ),
            (
                "/v1/chat/completions",
                {"json": {"messages": MSGS, "user": "s1"}, "headers": {"Authorization": f"Bearer {key}"}},
            ),
            (f"/episodes/{ep}/v1/chat/completions", {"content": b"x" * (h.settings.max_body_bytes + 1)}),
        ]
        statuses = []
        for path, kwargs in cases:
            hot, routed = await _both(h, path, **kwargs)
            statuses.append(hot.status_code)
            assert hot.status_code == routed.status_code, (path, hot.text, routed.text)
            assert hot.headers["content-type"] == routed.headers["content-type"]
            if hot.status_code == 200:
                a, b = hot.json(), routed.json()
                assert set(a) == set(b) and a["choices"][0].keys() == b["choices"][0].keys()
                assert hot.headers["x-flywheel-episode"] == routed.headers["x-flywheel-episode"]
                assert hot.headers["x-flywheel-call"] != routed.headers["x-flywheel-call"]
                assert int(hot.headers["content-length"]) == len(hot.content)
            else:
                assert hot.json() == routed.json(), path
        assert statuses == [200, 200, 400, 422, 404, 401, 401, 200, 413]


async def test_hot_path_streams(tmp_path: Path) -> None:
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        async with h.client.stream(
            "POST", f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS, "stream": True}
        ) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        text = "".join(
            (orjson.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
            for line in lines[:-1]
        )
        assert text == h.config.reply


async def test_client_gone_before_its_body_gets_no_answer_and_no_call(tmp_path: Path) -> None:
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        sent: list[Message] = []

        async def receive() -> Message:
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {
            "type": "http",
            "method": "POST",
            "path": f"/episodes/{ep}/v1/chat/completions",
            "root_path": "",
            "headers": [(b"content-type", b"application/json")],
            "query_string": b"",
        }
        await h.app(scope, receive, send)
        assert sent == []
        assert h.gateway.episodes.get(ep).next_seq == 0


def test_run_hosts_on_uvloop_when_installed() -> None:
    async def loop_module() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    module = run(loop_module())
    if importlib.util.find_spec("uvloop") is not None:
        assert module.startswith("uvloop")
    else:
        assert module.startswith("asyncio")
