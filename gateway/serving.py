"""Serving one LLM call: admit, forward, capture ids/logprobs, record durably, answer. No FastAPI here.

``CallService.serve(call)`` returns either a complete body (:class:`Answer`) or an async iterator of
SSE bytes (:class:`StreamAnswer`). The call's ``LLMCallRecorded`` is durable before the body is returned
(non-streamed) or before the held-back final chunks and ``[DONE]`` are yielded (streamed).

A call in another protocol (the Responses or Messages API, gateway/protocols/dialects.py) is served as the
chat call its :class:`~gateway.protocols.dialects.Exchange` translates it into; the exchange writes the
answer, or the stream's events, in the agent's protocol, which the call's event records as its response.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson

from gateway.control import Admission
from gateway.episodes.registry import EpisodeRegistry, EpisodeState
from gateway.errors import GatewayError, RecordingError, UpstreamError
from gateway.metrics import GatewayMetrics
from gateway.prompts import PromptStore, Substituted
from gateway.protocols.dialects import Exchange
from gateway.recording.capture import (
    Captured,
    StreamAssembler,
    capture_response,
    count_tokens,
    strip_response,
)
from gateway.recording.prepare import (
    Asked,
    Endpoint,
    PromptLayout,
    prepare_body,
    prompt_layout,
    sampling_temperature,
)
from gateway.recording.publishing import Recorder
from gateway.releases import ReleaseRouter, Routed
from gateway.upstream.client import Upstream, UpstreamPool, UpstreamResponse
from gateway.upstream.model_names import ModelNames
from gateway.upstream.tokens_in import prompt_prefix, turn_of, vllm_prompt_ids
from infra.logging import get_logger
from infra.policies import PolicyMap
from schemas import LLMCallRecorded, LogprobsMode, UpstreamKind, new_event_id

log = get_logger("gateway.serving")

PATHS: dict[Endpoint, str] = {"chat.completions": "chat/completions", "completions": "completions"}


@dataclass(slots=True)
class Call:
    episode: EpisodeState
    endpoint: Endpoint
    raw: bytes  # the body exactly as the agent sent it
    data: dict[str, Any]  # the parsed body (validated by protocol.py); an exchange's: the chat body
    exchange: Exchange | None = None  # set for a call in another protocol (gateway/protocols/dialects.py)

    @property
    def recorded_endpoint(self) -> str:
        return self.exchange.endpoint if self.exchange is not None else self.endpoint


@dataclass(slots=True)
class Answer:
    body: bytes
    call_id: str


@dataclass(slots=True)
class StreamAnswer:
    chunks: AsyncIterator[bytes]
    call_id: str


@dataclass(slots=True)
class _Ctx:
    call: Call
    upstream: Upstream
    asked: Asked
    layout: PromptLayout
    seq: int
    call_id: str
    version: int
    started_at: datetime
    t0: float
    prompt: Substituted | None = None
    temperature: float | None = None  # what the engine's logprobs are of
    admission: Admission | None = None  # the base's, or the call's adapter's (left when the call ends)
    adapter: str | None = None  # the policy's LoRA adapter that serves the call (infra/policies.py)
    adapter_version: int | None = None
    echo: str | None = None  # the model name the answer names when the engine was asked for another


class CallService:
    def __init__(
        self,
        *,
        pool: UpstreamPool,
        episodes: EpisodeRegistry,
        recorder: Recorder,
        admission: Admission,
        metrics: GatewayMetrics,
        producer: str = "gateway",
        on_recorded: Callable[[LLMCallRecorded], None] | None = None,
        prompts: PromptStore | None = None,
        tokens_in: bool = True,
        policies: PolicyMap | None = None,
        releases: ReleaseRouter | None = None,
        model_names: ModelNames | None = None,
    ) -> None:
        self.pool = pool
        self.model_names = model_names  # None: every call asks for the agent's own model name
        self.releases = releases
        self.episodes = episodes
        self.recorder = recorder
        self.admission = admission
        self.metrics = metrics
        self.producer = producer
        self.on_recorded = on_recorded
        self.prompts = prompts
        self.tokens_in = tokens_in
        self.policies = policies or PolicyMap()
        # one admission per adapter: an adapter's weight update drains and pauses only its own calls
        self.adapter_admission: dict[str, Admission] = {}
        self._base_names: dict[str, str] = {}  # upstream URL -> the base model's name there
        self._unloaded_warned: set[str] = set()  # adapters served by the base because not loaded upstream

    def admission_for(self, adapter: str | None) -> Admission:
        """The base's admission, or the adapter's (made on its first call or update, at version 0)."""
        if adapter is None:
            return self.admission
        adm = self.adapter_admission.get(adapter)
        if adm is None:
            adm = self.adapter_admission[adapter] = Admission(hold_s=self.admission.hold_s)
        return adm

    def _policy(self, call: Call) -> str | None:
        if not self.policies:
            return None
        return self.policies.policy_for(str(call.data.get("model") or ""), call.episode.tenant, call.data)

    def _prefix(self, call: Call, sent: dict[str, Any]) -> dict[str, Any] | None:
        """Tokens-in: the previous call's ids when this chat call extends it exactly
        (gateway/upstream/tokens_in.py)."""
        if not self.tokens_in:
            return None
        ep = call.episode
        prefix = prompt_prefix(sent, ep.turn, ep.prev_prompt, ep.prev_responses)
        if prefix is None and call.exchange is not None:
            prefix = call.exchange.prefix  # vouched for by the protocol itself
        return prefix

    async def serve(self, call: Call) -> Answer | StreamAnswer:
        adapter = self._policy(call)
        upstream = self.pool.pick(call.episode.episode_id, str(call.data.get("model") or ""))
        # with releases on: production at the served version, a versioned episode at its version
        routed = await self.releases.route(call.episode, adapter, upstream) if self.releases else None
        if routed is not None:
            adapter, upstream = routed.adapter, routed.upstream or upstream
        admission = routed.admission if routed and routed.admission else self.admission_for(adapter)
        entered = await admission.enter()
        version = self.admission.weight_version if adapter is not None else entered
        handed_off = False
        try:
            # the active prompt version substituted before the engine sees the call (gateway/prompts.py)
            prompt = self.prompts.apply(call.episode, call.data, call.raw) if self.prompts else None
            sent = prompt.data if prompt is not None else call.data
            body, asked = prepare_body(
                sent, call.endpoint, upstream.kind, weight_versions=upstream.request_weight_versions
            )
            requested = str(call.data.get("model") or "")
            if (model := await self._model(upstream, adapter, routed, requested)) is not None:
                body["model"] = model
            if upstream.kind is UpstreamKind.embedded and call.endpoint == "chat.completions":
                body.pop("prompt_prefix", None)  # the gateway's to set, never the agent's
                prefix = self._prefix(call, sent)
                if prefix is not None:
                    body["prompt_prefix"] = prefix
            elif upstream.kind is UpstreamKind.vllm and call.endpoint == "chat.completions":
                prefix = self._prefix(call, sent)
                ids = await vllm_prompt_ids(upstream, body, prefix) if prefix is not None else None
                if ids is not None:
                    body["kv_transfer_params"] = {
                        **(body.get("kv_transfer_params") or {}),
                        "prompt_token_ids": ids,
                    }
            seq = call.episode.take_seq()
            self.episodes.reserve(call.episode, seq)
            ctx = _Ctx(
                call,
                upstream,
                asked,
                prompt_layout(call.data, call.endpoint),
                seq,
                new_event_id(),
                version,
                datetime.now(UTC),
                time.perf_counter(),
            )
            ctx.prompt = prompt
            ctx.admission = admission
            if adapter is not None:
                ctx.adapter = adapter
                ctx.adapter_version = routed.adapter_version if routed is not None else entered
            ctx.temperature = sampling_temperature(body, upstream.kind)
            self.episodes.note_call(ctx.call_id, call.episode, seq)
            stream = bool(call.data.get("stream"))
            try:
                try:
                    response = await self.pool.send(
                        upstream, PATHS[call.endpoint], orjson.dumps(body), stream=stream
                    )
                except UpstreamError as exc:
                    base = await self._base_for_unloaded(ctx, exc)
                    if base is None:
                        raise
                    # the adapter's version 0 is the base (its B factors are zero): served by the base and
                    # recorded as that version, the call is neither lost nor mislabelled
                    body["model"], ctx.adapter_version = base, 0
                    response = await self.pool.send(
                        upstream, PATHS[call.endpoint], orjson.dumps(body), stream=stream
                    )
            except UpstreamError as exc:
                await self._record_failure(ctx, exc.status_code, exc.message, stream)
                raise
            ctx.echo = requested if requested and body.get("model") != requested else None
            if stream:
                handed_off = True
                return StreamAnswer(self._stream(ctx, response), ctx.call_id)
            try:
                data = orjson.loads(response.content)
                if not isinstance(data, dict):
                    raise orjson.JSONDecodeError("not an object", "", 0)
            except orjson.JSONDecodeError as exc:
                await self._record_failure(ctx, 502, "upstream returned invalid JSON", stream)
                raise UpstreamError("upstream returned invalid JSON", upstream=upstream.url) from exc
            captured = capture_response(data, call.endpoint, ctx.layout)
            if call.exchange is not None:
                answer = call.exchange.answer(data)
                await self._record(ctx, captured, streamed=False, answer=answer)
                call.exchange.recorded(answer, captured)
                return Answer(orjson.dumps(answer), ctx.call_id)
            await self._record(ctx, captured, streamed=False)
            strip_response(data, call.endpoint, asked)
            if ctx.echo is not None:
                data["model"] = ctx.echo
            return Answer(orjson.dumps(data), ctx.call_id)
        finally:
            if not handed_off:
                admission.leave()

    async def _model(
        self, up: Upstream, adapter: str | None, routed: Routed | None, asked: str
    ) -> str | None:
        """The name ``up`` is asked for instead of ``asked`` (None: ``asked``): the adapter's, or model_names'."""
        if adapter is not None:
            return routed.model if routed is not None and routed.model else adapter
        return await self.model_names.replacement(up, asked) if self.model_names is not None else None

    async def _base_for_unloaded(self, ctx: _Ctx, exc: UpstreamError) -> str | None:
        """The base's name at the upstream when it refused ``ctx``'s adapter as an unknown model, else None.

        vLLM answers an adapter's name only once that adapter is loaded (404 before: a call that comes
        before the trainer has loaded the adapter's version 0, or after vLLM restarted without it); the
        embedded engine serves the base for a name it has not loaded. The base's name is the entry of the
        upstream's ``/v1/models`` that names no parent (vLLM lists each adapter with its base as parent),
        else the model the agent asked for when that is not the adapter's name."""
        adapter = ctx.adapter
        if adapter is None or exc.status_code != 404 or adapter not in exc.message:
            return None
        url = ctx.upstream.url
        base = self._base_names.get(url)
        if base is None:
            base = await ctx.upstream.base_model()
            if base is not None:
                self._base_names[url] = base
        asked = str(ctx.call.data.get("model") or "")
        if base is None and asked and asked != adapter:
            base = asked
        if base is not None and adapter not in self._unloaded_warned:
            self._unloaded_warned.add(adapter)
            log.warning(
                "adapter not loaded upstream: served by the base as its version 0",
                adapter=adapter,
                upstream=url,
                base=base,
            )
        return base

    async def _stream(self, ctx: _Ctx, response: UpstreamResponse) -> AsyncIterator[bytes]:
        endpoint = ctx.call.endpoint
        asm = StreamAssembler(endpoint, ctx.layout)
        exchange = ctx.call.exchange
        events = exchange.stream() if exchange is not None else None
        held: list[bytes] = []
        try:
            try:
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = orjson.loads(payload)
                    if not isinstance(chunk, dict):
                        continue
                    if "error" in chunk and not chunk.get("choices"):
                        raise UpstreamError(
                            f"upstream stream error: {str(chunk['error'])[:500]}", upstream=ctx.upstream.url
                        )
                    asm.feed(chunk)
                    if events is not None:
                        outs = events.feed(chunk)
                    else:
                        strip_response(chunk, endpoint, ctx.asked)
                        if ctx.echo is not None and "model" in chunk:
                            chunk["model"] = ctx.echo
                        outs = [b"data: " + orjson.dumps(chunk) + b"\n\n"]
                    if asm.is_final(chunk):
                        held.extend(outs)
                    else:
                        for out in outs:
                            yield out
            except (httpx.HTTPError, orjson.JSONDecodeError, UpstreamError) as exc:
                err = exc if isinstance(exc, UpstreamError) else None
                message = err.message if err else f"upstream stream broke: {type(exc).__name__}"
                await self._record_failure(ctx, 502, message, True)
                broke = UpstreamError(message, upstream=ctx.upstream.url)
                yield events.error(broke) if events is not None else _sse_error(broke)
                return
            captured = asm.result()
            answer = exchange.answer(captured.response) if exchange is not None else None
            try:
                await self._record(ctx, captured, streamed=True, answer=answer)
            except RecordingError as exc:
                yield events.error(exc) if events is not None else _sse_error(exc)
                return
            for out in held:
                yield out
            if exchange is not None and events is not None and answer is not None:
                exchange.recorded(answer, captured)
                for out in events.finish(answer):
                    yield out
                return
            yield b"data: [DONE]\n\n"
        finally:
            await response.aclose()
            (ctx.admission or self.admission).leave()

    def _event(self, ctx: _Ctx, **fields: Any) -> LLMCallRecorded:
        ep = ctx.call.episode
        if ctx.prompt is not None and ctx.prompt.changes:
            fields["prompt_version"] = ctx.prompt.version
            fields["prompt_substitutions"] = ctx.prompt.changes
        return LLMCallRecorded(
            producer=self.producer,
            episode_id=ep.episode_id,
            call_seq=ctx.seq,
            call_id=ctx.call_id,
            source=ep.source,
            tenant=ep.tenant,
            endpoint=ctx.call.recorded_endpoint,
            model=str(ctx.call.data.get("model") or ""),
            request=ctx.call.raw.decode("utf-8", "replace"),
            upstream=ctx.upstream.kind,
            upstream_url=ctx.upstream.url,
            tokenizer=ctx.upstream.tokenizer,
            logprobs_mode=ctx.upstream.logprobs_mode if ctx.upstream.token_faithful else LogprobsMode.none,
            weight_version=ctx.version,
            adapter=ctx.adapter,
            adapter_version=ctx.adapter_version,
            temperature=ctx.temperature,
            latency_ms=(time.perf_counter() - ctx.t0) * 1000,
            started_at=ctx.started_at,
            **fields,
        )

    async def _record(
        self, ctx: _Ctx, captured: Captured, *, streamed: bool, answer: dict[str, Any] | None = None
    ) -> None:
        """Record a call; ``answer``: the body the agent gets when it is not the engine's (an exchange's)."""
        ep = ctx.call.episode
        faithful = ctx.upstream.token_faithful and captured.token_faithful
        prompt = captured.prompt_token_ids if faithful else None
        extends = ep.check_extension(prompt)
        mismatch = extends is False
        n_prompt, n_completion = count_tokens(captured)
        event = self._event(
            ctx,
            response=orjson.dumps(answer if answer is not None else captured.response).decode(),
            streamed=streamed,
            token_faithful=faithful,
            prompt_token_ids=captured.prompt_token_ids,
            choices=captured.choices,
            extends_previous=extends,
            prefix_mismatch=mismatch,
            prompt_tokens=n_prompt,
            completion_tokens=n_completion,
            weight_version_source=(
                "engine"
                if captured.choices and all(c.weight_versions for c in captured.choices)
                else "gateway"
            ),
        )
        try:
            await self.recorder.record(event)
        except RecordingError:
            self.metrics.calls.labels(ctx.call.recorded_endpoint, ep.source.value, "unrecorded").inc()
            raise
        ep.remember(prompt, [c.token_ids for c in captured.choices], mismatch)
        if self.tokens_in and ctx.call.endpoint == "chat.completions" and ep.prev_prompt is not None:
            sent = ctx.prompt.data if ctx.prompt is not None else ctx.call.data
            ep.turn = turn_of(sent, captured.response)
        else:
            ep.turn = None
        if self.on_recorded is not None:
            self.on_recorded(event)
        if mismatch:
            self.episodes.prefix_mismatches += 1
            self.metrics.prefix_mismatches.inc()
        m = self.metrics
        calls, latency = m.ok_call(ctx.call.recorded_endpoint, ep.source.value)
        calls.inc()
        latency.observe(time.perf_counter() - ctx.t0)
        m.prompt_tokens.inc(n_prompt)
        m.completion_tokens.inc(n_completion)

    async def _record_failure(self, ctx: _Ctx, status: int, message: str, streamed: bool) -> None:
        """Failed calls are recorded too (best effort: the agent gets an error either way)."""
        self.metrics.calls.labels(
            ctx.call.recorded_endpoint, ctx.call.episode.source.value, str(status)
        ).inc()
        try:
            await self.recorder.record(
                self._event(ctx, status_code=status, error=message[:4000], streamed=streamed)
            )
        except RecordingError:
            log.warning("failed call not recorded", episode_id=ctx.call.episode.episode_id, call_seq=ctx.seq)


def _sse_error(exc: GatewayError) -> bytes:
    return b"data: " + orjson.dumps(exc.body()) + b"\n\n"
