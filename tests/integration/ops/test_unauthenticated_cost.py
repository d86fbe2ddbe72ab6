"""What a client without credentials can cost a server (docs/operating.md, "Tenancy and access").

Through real servers on loopback ports: ``/metrics`` needs a token (the scrape-only one or the admin
token); wrong admin tokens are throttled per client address (the gateway's admin API and the engine's
control routes: 401 until the limit, then 429 with Retry-After, for the right token too; no token at
all is not counted; another address is not affected); a training-episode URL whose episode does not
exist is answered 404 before its body is read (a client that declares 5 MB and sends 10 bytes gets its
answer at once); oversized chunked bodies from eight clients at once cost the gateway a bounded peak of
memory; the engine answers a chunked body past its limit 413 (what follows is discarded, not held).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from infra.http import ADMIN_FAILURES_PER_MINUTE
from infra.service import HttpServer
from tests.fakes.gateway_harness import ADMIN, BackgroundGateway

pytestmark = pytest.mark.timeout(120)
SCRAPE = "scrape-only-token"


def _client(url: str, address: str) -> httpx.Client:
    """A client whose requests come from ``address`` (any 127.x.y.z is loopback on Linux)."""
    return httpx.Client(base_url=url, timeout=10, transport=httpx.HTTPTransport(local_address=address))


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundGateway]:
    with BackgroundGateway(tmp_path_factory.mktemp("gw"), episode_wait_s=0.05, metrics_token=SCRAPE) as g:
        yield g


def test_wrong_admin_tokens_are_throttled_per_address(gw: BackgroundGateway) -> None:
    wrong = {"Authorization": "Bearer not-the-token"}
    with _client(gw.url, "127.0.0.3") as guesser, _client(gw.url, "127.0.0.4") as other:
        for path in ("/admin/state", "/admin/versions"):
            for _ in range(5):  # no token at all: refused, and not counted as a guess
                assert guesser.get(path).status_code == 401
        for i in range(ADMIN_FAILURES_PER_MINUTE):
            r = guesser.get("/admin/state" if i % 2 else "/admin/versions", headers=wrong)
            assert r.status_code == 401, (i, r.text)
            assert r.json()["error"]["code"] == "invalid_admin_token"
        for path in ("/admin/state", "/admin/versions"):
            for headers in (wrong, ADMIN):  # past the limit the right token waits too: no oracle
                r = guesser.get(path, headers=headers)
                assert r.status_code == 429, (path, r.text)
                assert r.json()["error"]["code"] == "too_many_failed_tokens"
                assert 1 <= int(r.headers["retry-after"]) <= 60
        assert other.get("/admin/state", headers=ADMIN).status_code == 200  # another address
        assert guesser.get("/healthz").status_code == 200  # only the admin checks are throttled


def test_metrics_need_the_scrape_or_the_admin_token(gw: BackgroundGateway) -> None:
    with httpx.Client(base_url=gw.url, timeout=10) as c:
        refused = c.get("/metrics")
        assert refused.status_code == 401 and "flywheel_gateway" not in refused.text
        for token in (SCRAPE, ADMIN["Authorization"].removeprefix("Bearer ")):
            r = c.get("/metrics", headers={"Authorization": f"Bearer {token}"})
            assert r.status_code == 200 and "flywheel_gateway_calls_total" in r.text, r.text[:200]
        # the scrape token opens nothing else
        assert c.get("/admin/state", headers={"Authorization": f"Bearer {SCRAPE}"}).status_code == 401


def _raw_status(url: str, request: bytes, within_s: float) -> int:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=within_s) as s:
        s.sendall(request)
        head = s.recv(4096)
    return int(head.split(b" ", 2)[1])


def test_an_unknown_episode_is_answered_before_its_body_is_read(gw: BackgroundGateway) -> None:
    request = (
        b"POST /episodes/ep_does_not_exist/v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 5000000\r\n\r\n" + b'{"messages"'
    )
    started = time.monotonic()
    assert _raw_status(gw.url, request, within_s=5) == 404  # the other 4,999,990 bytes never sent
    assert time.monotonic() - started < 5


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


async def test_oversized_bodies_cost_bounded_memory(gw: BackgroundGateway) -> None:
    """Eight clients at once each stream 48 MiB, chunked (no length to refuse them by), to the call
    routes: without a key (401), to an unknown episode (404), and with a key (413 once past the 8 MiB
    limit). 384 MiB sent; the process (gateway and clients) grows by far less."""
    _, key = gw.h.keystore.create("big-bodies")
    size_mib = 48

    async def chunks() -> AsyncIterator[bytes]:
        block = b" " * (1 << 20)
        for _ in range(size_mib):
            yield block

    async def send(c: httpx.AsyncClient, i: int) -> int:
        url, headers = [
            ("/v1/chat/completions", {}),
            ("/episodes/ep_unknown/v1/chat/completions", {}),
            ("/v1/chat/completions", {"Authorization": f"Bearer {key}"}),
        ][i % 3]
        try:
            return (await c.post(url, content=chunks(), headers=headers)).status_code
        except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
            return 0  # answered and closed while the client was still sending: refused all the same

    before, peak, done = _rss_mib(), [0.0], threading.Event()

    def sample() -> None:  # the peak while the bodies come in (freed memory leaves RSS at once)
        while not done.wait(0.002):
            peak[0] = max(peak[0], _rss_mib())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        async with httpx.AsyncClient(base_url=gw.url, timeout=60) as c:
            statuses = await asyncio.gather(*(send(c, i) for i in range(8)))
    finally:
        done.set()
        sampler.join(5)
    grown = peak[0] - before
    assert set(statuses) <= {0, 401, 404, 413} and 413 in statuses, statuses
    assert grown < 8 * size_mib / 3, f"RSS grew {grown:.0f} MiB for {8 * size_mib} MiB sent"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    corpus = [f"What is {a}+{b}? {a + b}" for a in range(10) for b in range(10)]
    return build_tiny(
        tmp_path_factory.mktemp("tiny"), corpus, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1
    )


@pytest.fixture
async def engine_url(model_dir: Path) -> AsyncIterator[str]:
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app

    engine = InferenceEngine.from_pretrained(model_dir, max_model_len=64)
    server = HttpServer(create_engine_app(engine, admin_token="engine-secret"), host="127.0.0.1", port=0)
    url = await server.start()
    try:
        yield url
    finally:
        await server.stop()
        await engine.close()


async def test_the_engine_bounds_bodies_and_throttles_wrong_tokens(engine_url: str) -> None:
    from infra.engine.app import MAX_BODY_BYTES

    async def chunks() -> AsyncIterator[bytes]:  # chunked: no Content-Length to refuse it by
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 4):
            yield b" " * (1 << 20)

    async with httpx.AsyncClient(base_url=engine_url, timeout=30) as c:
        r = await c.post("/v1/chat/completions", content=chunks())
        assert r.status_code == 413, r.text
        assert r.json()["error"]["type"] == "BadRequestError"
        ok = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "1+1"}]})
        assert ok.status_code == 200, ok.text  # within the limit: served
        wrong = {"Authorization": "Bearer nope"}
        for _ in range(ADMIN_FAILURES_PER_MINUTE):
            assert (await c.post("/resume", headers=wrong)).status_code == 401
        for headers in (wrong, {"Authorization": "Bearer engine-secret"}):
            r = await c.post("/resume", headers=headers)
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1, r.text
        assert (await c.get("/health")).status_code == 200
