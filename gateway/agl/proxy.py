"""AGL's model-call proxy (``/proxy/rollout/{rid}/attempt/{aid}/mode/{train|val}/openai/v1/…``) on the
gateway's :class:`gateway.serving.CallService`: the same capture, durable recording and streaming as
every Flywheel call, with AGL's conventions on top.

- Forced parameters (AGL's ``ProxyRouter.prepare_body``): train → ``model``, the train temperature,
  ``return_token_ids`` and ``logprobs: true``; val → ``model``, the val temperature,
  ``return_token_ids`` (no logprobs). The upstream gets exactly that body: the two fields the gateway
  adds for its own capture (``logprobs``, ``return_token_ids``) are put back to AGL's values, so a val
  call asks no logprobs and a completions call asks ``logprobs: true`` as AGL's does. The agent gets
  vLLM's ids back (``prompt_token_ids``, ``choices[].token_ids``).
- Upstream: among the tenant's registered endpoints for the model, by sha256(rollout id), as AGL picks
  (one rollout, one server: its prefix cache is reused); else the server's own upstream (the embedded
  engine or ``--upstream``); else 503. An endpoint behind ``HTTP(S)_PROXY`` is reached through it.
- Errors: an upstream 4xx/5xx answer is relayed as it came (status and body) and recorded with
  ``status: "error"``; unreachable → 502, timed out → 504, AGL's texts.
- Pause (``/proxy/pause``): AGL's answer at once, 429, ``Retry-After``, ``X-Agl-Paused: true``,
  ``{"error": "gateway paused", "reason": …}``, checked before anything is sent. ``hold_s`` (default
  0, AGL's) lets a paused call wait that long for resume first. A Flywheel weight update holds calls
  for the gateway's ``pause_hold_s`` and answers the same 429 past it.
- Better than AGL: streaming works (AGL: 400), every choice is recorded, the call's weight version
  is the one that served it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import urllib.request
from collections.abc import AsyncIterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import orjson

from gateway.agl.models import Model
from gateway.agl.serving import AglError, AglService, not_found
from gateway.errors import (
    GatewayError,
    PausedError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from gateway.recording.prepare import Endpoint
from gateway.service import Gateway
from gateway.serving import Answer, Call, CallService, StreamAnswer
from gateway.upstream.client import Upstream, UpstreamPool, UpstreamResponse, make_upstream
from schemas import LLMCallRecorded, UpstreamKind

ENDPOINTS: dict[str, Endpoint] = {"chat/completions": "chat.completions", "completions": "completions"}


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    model_name: str
    train_temperature: float = 1.0
    val_temperature: float = 0.7
    include_logprobs: bool = True
    hold_s: float = 0.0  # how long a call made while /proxy/pause is in effect waits for resume


@dataclass(slots=True)
class _Call:
    """What the hooks below need to know about the call in flight (one per proxied request)."""

    tenant: str
    rollout_id: str
    attempt_id: str
    upstream: Upstream
    server: Model
    prepared: dict[str, Any]
    started: float = field(default_factory=time.perf_counter)
    error_status: int | None = None
    error_body: bytes = b""

    def as_agl(self, body: bytes) -> bytes:
        """The gateway's upstream body with AGL's own values for the fields the gateway adds."""
        data = orjson.loads(body)
        for key in CAPTURE_FIELDS:
            if key in self.prepared:
                data[key] = self.prepared[key]
            else:
                data.pop(key, None)
        return orjson.dumps(data)


_CALL: ContextVar[_Call] = ContextVar("agl_call")
# What gateway.recording.prepare.prepare_body adds to every call to a token-faithful upstream so it can record
# ids and logprobs; AGL decides these per mode (``prepared``), and its upstream gets AGL's choice.
CAPTURE_FIELDS = ("logprobs", "return_token_ids")


class AglUpstream(Upstream):
    """An upstream that sends AGL's body (:meth:`_Call.as_agl`) and keeps an error answer's body, so
    the proxy can relay it as AGL does."""

    async def post(self, path: str, body: bytes, *, stream: bool) -> UpstreamResponse:
        call = _CALL.get(None)
        if call is not None:
            body = call.as_agl(body)
        response = await super().post(path, body, stream=stream)
        if response.status_code != 200 and call is not None:
            call.error_status = response.status_code
            call.error_body = await response.aread()
        return response


class _Pool(UpstreamPool):
    """The upstream is chosen per call by the proxy (AGL's rule), not by episode."""

    def pick(self, episode_id: str, model: str = "") -> Upstream:
        return _CALL.get().upstream


def _proxied(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    return bool(urllib.request.getproxies().get(urlsplit(url).scheme)) and not urllib.request.proxy_bypass(
        host
    )


def as_agl(up: Upstream) -> AglUpstream:
    return AglUpstream(
        up.client, up.kind, up.logprobs_mode, up.name, up.request_weight_versions, up.timeout_s, up.wire
    )


class AglProxy:
    def __init__(
        self, service: AglService, gateway: Gateway, config: ProxyConfig, default: Upstream | None
    ) -> None:
        self.service = service
        self.gateway = gateway
        self.config = config
        self.default = as_agl(default) if default is not None else None
        self._endpoints: dict[str, AglUpstream] = {}
        s = gateway.settings
        self.calls = CallService(
            pool=_Pool(
                [self.default] if self.default else [as_agl(make_upstream("http://unset/v1"))],
                retries=s.upstream_retries,
                backoff_s=s.upstream_backoff_s,
            ),
            episodes=gateway.episodes,
            recorder=gateway.recorder,
            admission=gateway.admission,
            metrics=gateway.metrics,
            producer=f"agl-server:{gateway.id}",
            on_recorded=self._recorded,
        )

    async def aclose(self) -> None:
        for up in self._endpoints.values():
            await up.client.aclose()
            if up.wire is not None:
                await up.wire.aclose()

    # --------------------------------------------------------------------------------- choice
    def _upstream(self, endpoint: str) -> AglUpstream:
        up = self._endpoints.get(endpoint)
        if up is None:
            s = self.gateway.settings
            up = self._endpoints[endpoint] = as_agl(
                make_upstream(
                    endpoint,
                    kind=UpstreamKind.vllm,
                    logprobs_mode=s.logprobs_mode,
                    api_key=s.upstream_api_key,
                    timeout_s=s.upstream_timeout_s,
                    wire=not _proxied(endpoint),
                )
            )
        return up

    def choose(self, tenant: str, rollout_id: str) -> tuple[Upstream, Model]:
        servers = self.service.tenant(tenant).models.get(self.config.model_name, {})
        if servers:
            pool = [servers[e] for e in sorted(servers)]
            index = int.from_bytes(hashlib.sha256(rollout_id.encode()).digest()[:8], "big") % len(pool)
            chosen = pool[index]
            return self._upstream(chosen.endpoint), chosen
        if self.default is not None:
            version = self.gateway.admission.weight_version
            return self.default, Model(
                model=self.config.model_name, endpoint=self.default.url, version=version
            )
        raise AglError(503, f"No servers available for model '{self.config.model_name}'")

    def prepare(self, body: dict[str, Any], mode: str) -> dict[str, Any]:
        c = self.config
        if mode == "train":
            out = {
                **body,
                "model": c.model_name,
                "temperature": c.train_temperature,
                "return_token_ids": True,
            }
            if c.include_logprobs:
                out["logprobs"] = True
            return out
        return {**body, "model": c.model_name, "temperature": c.val_temperature, "return_token_ids": True}

    # ---------------------------------------------------------------------------------- serve
    async def serve(
        self, tenant: str, rollout_id: str, attempt_id: str, mode: str, path: str, raw: bytes
    ) -> Answer | StreamAnswer:
        if mode not in ("train", "val"):
            raise AglError(404, f"Unsupported proxy mode: {mode}")
        if path not in ENDPOINTS:
            raise AglError(404, f"Unsupported upstream path: {path}")
        rollout = self.service.tenant(tenant).rollouts.get(rollout_id)
        if rollout is None:
            raise not_found(rollout_id)
        try:
            body = orjson.loads(raw) if raw else {}
        except orjson.JSONDecodeError:
            raise AglError(400, "Invalid JSON in request body") from None
        if not isinstance(body, dict):
            raise AglError(400, "Request body must be a JSON object")
        upstream, server = self.choose(tenant, rollout_id)
        prepared = self.prepare(body, mode)
        await self._admit(tenant)
        handed_off = False
        try:
            episode, started = self.service.open_attempt(tenant, rollout, attempt_id)
            if started is not None:
                await self.service.publish(started)
            call = _Call(tenant, rollout_id, attempt_id, upstream, server, prepared)
            _CALL.set(call)
            try:
                answer = await self.calls.serve(Call(episode, ENDPOINTS[path], raw, prepared))
            except UpstreamError as exc:
                raise self._failed(call, exc) from exc
            except PausedError as exc:
                raise _paused(self.service.pause_state(tenant).retry_after_seconds, "weight update") from exc
            except GatewayError as exc:
                raise AglError(exc.status_code, exc.message) from exc
            if isinstance(answer, StreamAnswer):
                handed_off = True
                return StreamAnswer(self._counted(call, answer.chunks), answer.call_id)
            return answer
        finally:
            if not handed_off:
                self._leave(tenant)

    async def _admit(self, tenant: str) -> None:
        """A paused tenant's call gets AGL's 429 (after waiting up to ``hold_s`` for resume, when set);
        an admitted call is counted in flight."""
        pause = self.service.tenant(tenant).pause
        if pause.paused:
            if self.config.hold_s > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.service.resumed(tenant).wait(), self.config.hold_s)
            pause = self.service.tenant(tenant).pause
            if pause.paused:
                raise _paused(pause.retry_after_seconds, pause.reason)
        self.service.inflight[tenant] = self.service.inflight.get(tenant, 0) + 1

    def _leave(self, tenant: str) -> None:
        self.service.inflight[tenant] = max(0, self.service.inflight.get(tenant, 1) - 1)

    async def _counted(self, call: _Call, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """The stream, with the call known to the recording hook (it runs in the response's task)
        and counted in flight until its last chunk."""
        _CALL.set(call)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            self._leave(call.tenant)

    # ------------------------------------------------------------------------------ recording
    def _data(self, call: _Call, response: Any, status: int, **more: Any) -> dict[str, Any]:
        choices = response.get("choices") if isinstance(response, dict) else None
        first = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
        usage = response.get("usage") if isinstance(response, dict) else None
        reason = first.get("finish_reason")
        return {
            "model": call.server.model,
            "model_version": more.pop("weight_version", call.server.version),
            "request": call.prepared,
            "response": response,
            "server": call.server.model_dump(mode="json"),
            "latency_ms": (time.perf_counter() - call.started) * 1000,
            "http_status": status,
            "status": "ok" if status < 400 else "error",
            "retry_count": 0,
            "routed_experts": None,
            "usage": usage if isinstance(usage, dict) else None,
            "finish_reason": reason if isinstance(reason, str) and reason else None,
            **more,
        }

    def _recorded(self, event: LLMCallRecorded) -> None:
        """The gateway recorded a call (bus or spool): journal its AGL ``model_request`` event."""
        call = _CALL.get(None)
        if call is None:
            return
        response = orjson.loads(event.response) if event.response else {}
        versions = [v for c in event.choices for v in (c.weight_versions or [])]
        data = self._data(
            call,
            response,
            event.status_code,
            weight_version=max(versions) if versions else call.server.version,
            call_id=event.call_id,
            streamed=event.streamed,
        )
        self.service.append_call(call.tenant, call.rollout_id, call.attempt_id, data, event)

    def _failed(self, call: _Call, exc: UpstreamError) -> AglError:
        """An upstream error: the AGL event recorded, and the answer AGL would give."""
        if call.error_status is not None and not isinstance(exc, UpstreamTimeoutError):
            try:
                body: Any = orjson.loads(call.error_body) if call.error_body else {}
            except orjson.JSONDecodeError:
                body = {}
            self.service.append_call(
                call.tenant, call.rollout_id, call.attempt_id, self._data(call, body, call.error_status), None
            )
            return AglError(call.error_status, exc.message, body=body)
        if isinstance(exc, UpstreamTimeoutError):
            status, detail = 504, "Upstream model server timed out"
        elif isinstance(exc, UpstreamUnavailableError):
            status, detail = 502, "Upstream model server request failed"
        else:
            status, detail = exc.status_code, exc.message
        error = {"error": {"message": exc.message}}
        self.service.append_call(
            call.tenant, call.rollout_id, call.attempt_id, self._data(call, error, status), None
        )
        return AglError(status, detail)


def _paused(retry_after: int, reason: str | None) -> AglError:
    return AglError(
        429,
        "gateway paused",
        headers={"Retry-After": str(retry_after), "X-Agl-Paused": "true"},
        body={"error": "gateway paused", "reason": reason},
    )
