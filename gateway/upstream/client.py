"""Upstream model servers: an ``httpx.AsyncClient`` with a kind and a logprobs mode.

The gateway is handed its upstreams (tests inject ``transport=``; the embedded engine is reached through
``httpx.ASGITransport`` or a loopback port). Several replicas: an episode sticks to one of them.
Connection errors, 429 and 5xx are retried with exponential backoff before anything reaches the agent.
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from gateway.errors import UpstreamError, UpstreamTimeoutError, UpstreamUnavailableError
from gateway.upstream.wire import WirePool
from schemas import LogprobsMode, UpstreamKind

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class UpstreamResponse(Protocol):
    """What the gateway reads of an upstream response: ``httpx.Response`` or ``WireResponse``."""

    @property
    def status_code(self) -> int: ...

    @property
    def headers(self) -> Mapping[str, str]: ...

    @property
    def content(self) -> bytes: ...

    async def aread(self) -> bytes: ...

    def aiter_lines(self) -> AsyncIterator[str]: ...

    async def aclose(self) -> None: ...


@dataclass(slots=True)
class Upstream:
    """One model server. ``client.base_url`` ends with ``/v1`` (requests go to ``chat/completions``).

    ``wire`` (set by ``make_upstream`` for plain ``http://`` URLs without an injected transport) carries
    the calls instead of ``client``: the same requests, a fraction of the CPU (``gateway/upstream/wire.py``).
    """

    client: httpx.AsyncClient
    kind: UpstreamKind = UpstreamKind.vllm
    logprobs_mode: LogprobsMode = LogprobsMode.processed
    name: str = ""
    request_weight_versions: bool = False
    timeout_s: float = 120.0  # until the response head (non-streamed: the whole body) has arrived
    wire: WirePool | None = None
    tokenizer: str | None = None  # the fingerprint of the tokenizer its ids come from (recorded per call)

    async def post(self, path: str, body: bytes, *, stream: bool) -> UpstreamResponse:
        if self.wire is not None:
            return await self.wire.post(path, body, stream=stream)
        request = self.client.build_request(
            "POST", path, content=body, headers={"Content-Type": "application/json"}
        )
        return await self.client.send(request, stream=stream)

    async def base_model(self) -> str | None:
        """The base model's name in the server's ``/v1/models``: the first entry that names no parent
        (vLLM lists each LoRA adapter with its base as ``parent``); None when it does not answer."""
        root = str(self.client.base_url).rstrip("/").removesuffix("/v1")
        try:
            r = await self.client.get(root + "/v1/models", timeout=min(30.0, self.timeout_s))
            listing = r.json() if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None
        data = listing.get("data") if isinstance(listing, dict) else None
        for entry in data if isinstance(data, list) else []:
            if isinstance(entry, dict) and entry.get("id") and not entry.get("parent"):
                return str(entry["id"])
        return None

    async def tokenize_chat(self, body: dict[str, Any]) -> list[int] | None:
        """vLLM's ``/tokenize`` (beside ``/v1``) for a chat body: the ids its template renders; None when
        it does not answer with them (another server, an older vLLM, a template error)."""
        root = str(self.client.base_url).rstrip("/").removesuffix("/v1")
        try:
            r = await self.client.post(root + "/tokenize", json=body, timeout=min(30.0, self.timeout_s))
        except httpx.HTTPError:
            return None
        if r.status_code != 200:
            return None
        try:
            ids = r.json().get("tokens")
        except ValueError:
            return None
        if not isinstance(ids, list) or not all(type(i) is int for i in ids):
            return None
        return ids

    @property
    def token_faithful(self) -> bool:
        return self.kind in (UpstreamKind.vllm, UpstreamKind.embedded)

    @property
    def url(self) -> str:
        return self.name or str(self.client.base_url)


def make_upstream(
    url: str,
    *,
    kind: UpstreamKind = UpstreamKind.vllm,
    logprobs_mode: LogprobsMode = LogprobsMode.processed,
    api_key: str = "",
    timeout_s: float = 120.0,
    transport: httpx.AsyncBaseTransport | None = None,
    request_weight_versions: bool = False,
    wire: bool = True,
) -> Upstream:
    """An upstream for ``url`` (``http://host:port/v1``) with a pooled client sized for many agents.

    Plain ``http://`` without ``transport`` is served by the lean keep-alive client (``wire=False``:
    httpx for everything).
    """
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = httpx.AsyncClient(
        base_url=url.rstrip("/") + "/",
        headers=headers,
        timeout=httpx.Timeout(timeout_s, connect=min(10.0, timeout_s)),
        limits=httpx.Limits(max_connections=1024, max_keepalive_connections=256),
        transport=transport,
    )
    if kind is UpstreamKind.openai:
        logprobs_mode = LogprobsMode.none
    lean = None
    if wire and transport is None and url.startswith("http://"):
        lean = WirePool(
            url.rstrip("/") + "/",
            headers=headers,
            connect_timeout_s=min(10.0, timeout_s),
            read_timeout_s=timeout_s,
        )
    return Upstream(client, kind, logprobs_mode, url, request_weight_versions, timeout_s, lean)


class UpstreamPool:
    """Replicas of one model; ``pick(episode_id)`` is sticky so an episode's KV-cache prefix is reused."""

    def __init__(self, upstreams: Sequence[Upstream], *, retries: int = 2, backoff_s: float = 0.2) -> None:
        if not upstreams:
            raise ValueError("the gateway needs at least one upstream")
        self.upstreams = list(upstreams)
        self.retries = retries
        self.backoff_s = backoff_s

    def pick(self, episode_id: str, model: str = "") -> Upstream:
        """The replica for ``episode_id``; ``model`` is for :class:`gateway.upstream.routing.RoutedPool`."""
        return self.upstreams[zlib.crc32(episode_id.encode()) % len(self.upstreams)]

    async def aclose(self) -> None:
        for up in self.upstreams:
            await up.client.aclose()
            if up.wire is not None:
                await up.wire.aclose()

    async def send(self, upstream: Upstream, path: str, body: bytes, *, stream: bool) -> UpstreamResponse:
        """POST ``body`` to ``path``; retried on connection errors/429/5xx; errors translated.

        A streamed response is returned open (status 200); the caller closes it.
        """
        attempt = 0
        while True:
            try:
                # asyncio.timeout, not wait_for: wait_for runs the send in a task of its own per call
                async with asyncio.timeout(upstream.timeout_s):
                    response = await upstream.post(path, body, stream=stream)
            except (httpx.TimeoutException, TimeoutError) as exc:
                raise UpstreamTimeoutError(
                    f"upstream {upstream.url} timed out", upstream=upstream.url, code="upstream_timeout"
                ) from exc
            except httpx.TransportError as exc:
                if attempt < self.retries:
                    attempt += 1
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1))
                    continue
                raise UpstreamUnavailableError(
                    f"upstream {upstream.url} unreachable: {type(exc).__name__}",
                    upstream=upstream.url,
                    code="upstream_unavailable",
                ) from exc
            if response.status_code == 200:
                return response
            try:
                content = await response.aread()
            except httpx.HTTPError:
                content = b""
            finally:
                await response.aclose()
            if response.status_code in RETRY_STATUSES and attempt < self.retries:
                attempt += 1
                retry_after = _retry_after(response)
                await asyncio.sleep(max(retry_after, self.backoff_s * 2 ** (attempt - 1)))
                continue
            raise UpstreamError(
                _upstream_message(response.status_code, content),
                upstream=upstream.url,
                status_code=response.status_code,
                code="upstream_error",
            )


def _retry_after(response: UpstreamResponse) -> float:
    try:
        return min(float(response.headers.get("retry-after", "0")), 5.0)
    except ValueError:
        return 0.0


def _upstream_message(status: int, content: bytes) -> str:
    import orjson

    try:
        data = orjson.loads(content)
        if isinstance(data, dict):
            err = data.get("error", data)
            msg = err.get("message") if isinstance(err, dict) else err
            if msg is None and isinstance(data.get("detail"), str):
                msg = data["detail"]
            if msg:
                return f"upstream error {status}: {str(msg)[:2000]}"
    except orjson.JSONDecodeError:
        pass
    return f"upstream error {status}: {content[:500].decode('utf-8', 'replace')}"
