"""Adapter for Agent Lightning 1.0.2's own server tests: it becomes their ``tests/server/conftest.py``.

AGL's conftest builds its app in-process (``create_app`` + ``TestClient``) and clears its module-level
dicts between tests. This one replaces exactly that: ``client`` is an ``httpx.Client`` on a running
``flywheel agl-server`` (``AGL_ADAPTER_SERVER_URL``), and each test gets a fresh tenant key (isolation
without clearing anything: a key sees only its own rollouts, models and pause state). The assertions
are AGL's, untouched.

Two of AGL's tests replace its upstream call (``monkeypatch.setattr(
"agentlightning.server.proxy._send_upstream_with_retries", fake)``) and assert on the URL and body the
server sends. Here the server reaches ``http://model.test/v1`` through ``HTTP_PROXY`` = the stub below,
which hands the request the server really sent to whatever that attribute is now (the test's fake:
its assertions run on Flywheel's request) and answers with the fake's response. An exception in the
fake fails the test at teardown.

``app`` (for ``test_proxy_disconnect.py``, which serves it with uvicorn itself) is a relay to the
running server that hangs up on it when its own client hangs up, so a disconnect reaches the server.

Runs inside the Python 3.12 venv that has ``agentlightning`` 1.0.2 installed (not Flywheel's).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, Request, Response  # annotations below are resolved at module level

AGL_KEY = "per-test: see auth_headers"
MODEL_NAME = "test-model"

SERVER_URL = os.environ["AGL_ADAPTER_SERVER_URL"]
STUB_PORT = int(os.environ["AGL_ADAPTER_STUB_PORT"])
_KEYS: list[str] = json.loads(Path(os.environ["AGL_ADAPTER_KEYS"]).read_text())
_stub_errors: list[BaseException] = []


class _Stub(BaseHTTPRequestHandler):
    """The model server ``flywheel agl-server`` reaches through its HTTP proxy."""

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        send = importlib.import_module("agentlightning.server.proxy")._send_upstream_with_retries

        async def forward() -> httpx.Response:
            async with httpx.AsyncClient() as client:
                return await send(client=client, url=self.path, body=body)

        try:
            response = asyncio.run(forward())
            status, content = response.status_code, response.content
        except BaseException as exc:  # the test's fake asserted: fail that test, answer something
            _stub_errors.append(exc)
            status, content = 500, b'{"error": "adapter stub: the test upstream raised"}'
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="session", autouse=True)
def _stub_upstream() -> Iterator[None]:
    server = ThreadingHTTPServer(("127.0.0.1", STUB_PORT), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield
    server.shutdown()


@pytest.fixture(autouse=True)
def clean_store() -> Iterator[None]:
    """AGL clears its dicts here; a fresh tenant per test isolates instead. Surfaces stub failures."""
    _stub_errors.clear()
    yield
    if _stub_errors:
        raise _stub_errors[0]


@pytest.fixture
def tenant_key() -> str:
    if not _KEYS:
        pytest.fail("the adapter ran out of tenant keys (AGL_ADAPTER_KEYS)")
    return _KEYS.pop(0)


@pytest.fixture
def server_config() -> dict[str, Any]:
    """What ``flywheel agl-server`` was started with (the test command passes these flags)."""
    return {
        "key": "per-test",
        "default_proxy": {"model_name": MODEL_NAME, "train": {"temperature": 1}, "val": {"temperature": 0}},
    }


@pytest.fixture
def client() -> Iterator[httpx.Client]:
    with httpx.Client(base_url=SERVER_URL, timeout=30) as c:
        yield c


@pytest.fixture
def auth_headers(tenant_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {tenant_key}"}


@pytest.fixture
def app() -> Any:
    """A relay to the running server, for tests that serve ``app`` with uvicorn themselves."""
    relay = FastAPI()
    upstream = httpx.AsyncClient(base_url=SERVER_URL, timeout=60)

    async def hung_up(request: Request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    @relay.api_route("/{path:path}", methods=["GET", "POST", "PATCH", "DELETE"])
    async def forward(path: str, request: Request) -> Response:
        body = await request.body()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")}
        sending = asyncio.create_task(
            upstream.request(
                request.method, "/" + path, params=request.query_params, content=body, headers=headers
            )
        )
        gone = asyncio.create_task(hung_up(request))
        try:
            done, _ = await asyncio.wait((sending, gone), return_when=asyncio.FIRST_COMPLETED)
            if sending not in done:
                return Response(status_code=499)  # the connection to the server closes with the task
            answer = sending.result()
        finally:
            for task in (sending, gone):
                task.cancel()
            with contextlib.suppress(BaseException):
                await asyncio.gather(sending, gone, return_exceptions=True)
        kept = {
            k: v for k, v in answer.headers.items() if k.lower() not in ("content-length", "content-encoding")
        }
        return Response(answer.content, status_code=answer.status_code, headers=kept)

    return relay
