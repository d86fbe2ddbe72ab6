"""The gateway's capture path over ASGI: in-process bus, fake vLLM-compatible upstream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from schemas import EPISODES, EpisodeFinished, LLMCallRecorded, UpstreamKind
from tests.fakes.gateway_harness import ADMIN, GatewayHarness
from tests.fakes.upstream import FakeUpstreamConfig, render_prompt
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.timeout(30)

MSGS = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]


def _calls(h: GatewayHarness) -> list[LLMCallRecorded]:
    return h.events.of(LLMCallRecorded)


async def test_chat_records_ids_and_logprobs_and_strips_them(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"model": "m", "messages": MSGS})
        assert r.status_code == 200, r.text
        body = r.json()
        assert "prompt_token_ids" not in body
        assert "token_ids" not in body["choices"][0]
        assert body["choices"][0]["logprobs"] is None
        assert body["choices"][0]["message"]["content"] == "The answer is 42."
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert call.episode_id == ep and call.call_seq == 0 and call.token_faithful
        assert call.prompt_token_ids == render_prompt(MSGS)
        ch = call.choices[0]
        assert ch.text == "The answer is 42."
        assert ch.token_ids is not None and len(ch.token_ids) == len(ch.logprobs or []) > 0
        assert call.extends_previous is None and not call.prefix_mismatch
        assert orjson.loads(call.request) == {"model": "m", "messages": MSGS}
        sent = h.config.requests[-1]
        assert sent["return_token_ids"] is True and sent["logprobs"] is True


async def test_client_asked_logprobs_are_kept(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        r = await h.client.post(
            f"/episodes/{ep}/v1/chat/completions",
            json={"messages": MSGS, "logprobs": True, "top_logprobs": 3, "n": 2, "unknown_field": {"x": 1}},
        )
        body = r.json()
        assert len(body["choices"]) == 2
        assert len(body["choices"][1]["logprobs"]["content"][0]["top_logprobs"]) == 3
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert len(call.choices) == 2 and call.choices[1].text.endswith("#1")
        assert call.choices[0].top_logprobs is not None and len(call.choices[0].top_logprobs[0]) == 3
        assert h.config.requests[-1]["unknown_field"] == {"x": 1}


async def test_extension_and_prefix_mismatch(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"
        r1 = (await h.client.post(url, json={"messages": MSGS})).json()
        history = [*MSGS, r1["choices"][0]["message"], {"role": "user", "content": "more"}]
        await h.client.post(url, json={"messages": history})
        rewritten = [{"role": "user", "content": "summary of before"}, {"role": "user", "content": "more"}]
        await h.client.post(url, json={"messages": rewritten})
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
        by_seq = {c.call_seq: c for c in calls}
        assert by_seq[1].extends_previous is True and not by_seq[1].prefix_mismatch
        assert by_seq[2].extends_previous is False and by_seq[2].prefix_mismatch
        assert h.gateway.episodes.get(ep).prefix_mismatches == 1
        metrics = (await h.client.get("/metrics", headers=ADMIN)).text
        assert "flywheel_gateway_prefix_mismatches_total 1.0" in metrics


async def test_streaming_chat_recorded_before_done(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        text, seen_record_before_done = "", False
        async with h.client.stream(
            "POST",
            f"/episodes/{ep}/v1/chat/completions",
            json={"messages": MSGS, "stream": True, "stream_options": {"include_usage": True}},
        ) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    seen_record_before_done = bool(_calls(h)) or bool(h.gateway.recent_calls(ep))
                    break
                chunk = orjson.loads(line[6:])
                assert "prompt_token_ids" not in chunk
                for c in chunk["choices"]:
                    assert "token_ids" not in c and c.get("logprobs") is None
                    text += c["delta"].get("content") or ""
        assert seen_record_before_done
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert call.streamed and call.token_faithful
        assert call.choices[0].text == text == "The answer is 42."
        assert call.prompt_token_ids == render_prompt(MSGS)
        assert call.completion_tokens == len(call.choices[0].token_ids or [])


async def test_streamed_tool_call_is_assembled(tmp_path):
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        async with h.client.stream(
            "POST",
            f"/episodes/{ep}/v1/chat/completions",
            json={"messages": MSGS, "tools": tools, "stream": True},
        ) as r:
            lines = [line async for line in r.aiter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        msg = call.choices[0].message
        assert msg["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"x": 1}'}
        assert call.choices[0].finish_reason == "tool_calls" and call.token_faithful


async def test_completions_plain_and_streamed(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        r = await h.client.post(f"/episodes/{ep}/v1/completions", json={"prompt": "2+2=", "max_tokens": 5})
        body = r.json()
        assert body["choices"][0]["text"] == "The a" and body["choices"][0]["logprobs"] is None
        assert "token_ids" not in body["choices"][0]
        async with h.client.stream(
            "POST", f"/episodes/{ep}/v1/completions", json={"prompt": "2+2=", "stream": True, "logprobs": 2}
        ) as resp:
            got = [
                orjson.loads(x[6:])
                for x in [ln async for ln in resp.aiter_lines()]
                if x.startswith("data: {")
            ]
        assert any(c["choices"][0].get("logprobs") for c in got)
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=2)
        first, second = sorted(calls, key=lambda c: c.call_seq)
        assert first.prompt_token_ids == list(b"2+2=") and first.choices[0].finish_reason == "length"
        assert second.streamed and second.token_faithful and second.endpoint == "completions"
        assert second.choices[0].text == "".join(c["choices"][0]["text"] for c in got)
        assert second.extends_previous is False  # different call, same prompt: not an extension


async def test_unknown_and_finished_episode_404_and_late_start(tmp_path):
    async with GatewayHarness(tmp_path, episode_wait_s=2.0) as h:
        r = await h.client.post("/episodes/not-an-id/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
        # EpisodeStarted arriving just after the agent's first call: the call waits for it
        from schemas import EpisodeStarted, new_episode_id

        ep = new_episode_id()
        call = asyncio.create_task(
            h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        )
        await asyncio.sleep(0)
        await h.bus.publish(EPISODES, EpisodeStarted(episode_id=ep))
        assert (await call).status_code == 200
        await h.bus.publish(EPISODES, EpisodeFinished(episode_id=ep, status="ok"))
        await h.events.wait_for(lambda e: isinstance(e, EpisodeFinished))
        await wait_until(lambda: h.gateway.episodes.get(ep) is None, within_s=5, what="the episode closed")
        r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 404


async def test_openai_kind_is_text_only(tmp_path):
    async with GatewayHarness(tmp_path, kind=UpstreamKind.openai) as h:
        ep = await h.open_episode()
        r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 200
        assert "return_token_ids" not in h.config.requests[-1]
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert not call.token_faithful and call.upstream is UpstreamKind.openai
        assert call.choices[0].text == "The answer is 42." and call.logprobs_mode.value == "none"


async def test_upstream_retries_errors_and_timeout(tmp_path):
    cfg = FakeUpstreamConfig()
    async with GatewayHarness(tmp_path, config=cfg, upstream_timeout_s=0.5, upstream_retries=2) as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"
        cfg.fail_next = [429, 503]
        assert (await h.client.post(url, json={"messages": MSGS})).status_code == 200
        cfg.fail_next = [500, 500, 500]
        r = await h.client.post(url, json={"messages": MSGS})
        assert r.status_code == 500 and "injected 500" in r.json()["error"]["message"]
        cfg.fail_next = [400]
        r = await h.client.post(url, json={"messages": MSGS})
        assert r.status_code == 400 and r.json()["error"]["code"] == "upstream_error"
        cfg.hang_next = 1
        r = await h.client.post(url, json={"messages": MSGS})
        assert r.status_code == 504 and r.json()["error"]["type"] == "timeout"
        failed = await h.events.wait_for(
            lambda e: isinstance(e, LLMCallRecorded) and e.error is not None, count=3
        )
        assert sorted(c.status_code for c in failed) == [400, 500, 504]


async def test_weight_versions_and_reward(tmp_path):
    cfg = FakeUpstreamConfig(weight_version=0)
    async with GatewayHarness(tmp_path, config=cfg, request_weight_versions=True) as h:
        h.upstreams[0].request_weight_versions = True
        ep = await h.open_episode()
        await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert call.weight_version == 0 and set(call.choices[0].weight_versions or []) == {0}
        r = await h.client.post(
            f"/episodes/{ep}/reward", json={"value": 1.5, "call_index": 0, "message": "good"}
        )
        assert r.status_code == 200
        from schemas import RewardReported

        (rew,) = await h.events.wait_for(lambda e: isinstance(e, RewardReported))
        assert rew.value == 1.5 and rew.call_seq == 0 and rew.episode_id == ep


async def test_agl_events_are_kept_and_a_reward_event_is_the_agent_reward(tmp_path):
    from schemas import AGL, AglRecorded, RewardReported

    async with GatewayHarness(tmp_path) as h:
        await h.bus.ensure_topics([AGL])
        await h.events.attach(h.bus, AGL, group="agl-collector")
        ep = await h.open_episode()
        url = f"/episodes/{ep}/agl/events"
        r = await h.client.post(url, json={"event_type": "reward", "data": {"value": 1, "message": "right"}})
        assert r.status_code == 200, r.text
        assert r.json()["event_type"] == "reward" and r.json()["rollout_id"] == ep
        r = await h.client.post(url, json={"event_type": "step", "data": {"turn": 2}})
        assert r.status_code == 200, r.text
        for bad in ({"value": "1"}, {"value": True}, {}, {"value": None}):
            r = await h.client.post(url, json={"event_type": "reward", "data": bad})
            assert r.status_code == 422 and r.json()["error"]["param"] == "data.value", (bad, r.text)
        assert (await h.client.post(url, json={"data": {}})).status_code == 422
        missing = await h.client.post("/episodes/0123/agl/events", json={"event_type": "step"})
        assert missing.status_code == 404
        (rew,) = await h.events.wait_for(lambda e: isinstance(e, RewardReported))
        assert rew.value == 1.0 and rew.episode_id == ep and rew.message == "right"
        kept = await h.events.wait_for(lambda e: isinstance(e, AglRecorded), count=2)
        assert [e.data for e in kept] == [
            {"event_type": "reward", "data": {"value": 1, "message": "right"}},
            {"event_type": "step", "data": {"turn": 2}},
        ]
        assert all(e.episode_id == ep and e.kind == "event" for e in kept)


async def test_replicas_are_sticky(tmp_path):
    async with GatewayHarness(tmp_path, replicas=3) as h:
        eps = [await h.open_episode() for _ in range(6)]
        for ep in eps:
            for _ in range(2):
                await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=12)
        per_ep: dict[str, set[str]] = {}
        for c in calls:
            per_ep.setdefault(c.episode_id, set()).add(c.upstream_url)
        assert all(len(urls) == 1 for urls in per_ep.values())


async def test_readyz_waits_for_the_parts_still_starting(tmp_path):
    # the embedded stack marks its gateway "starting" until the worker, reward service and trainer are up
    async with GatewayHarness(tmp_path) as h:
        ready = await h.client.get("/readyz")
        assert ready.status_code == 200 and ready.json() == {"ok": True}  # details: /admin/state only
        assert (await h.client.get("/admin/state")).status_code == 401
        h.gateway.starting.add("stack")
        r = await h.client.get("/readyz")
        assert r.status_code == 503 and "still starting: stack" in r.json()["error"]["message"], r.text
        h.gateway.starting.discard("stack")
        assert (await h.client.get("/readyz")).status_code == 200


async def test_the_event_records_the_temperature_the_engine_sampled_at(tmp_path: Path) -> None:
    """What the trainer divides the logits by: the body's temperature as sent upstream, else the engine's
    default 1.0; greedy (0) is 1.0, as engines report greedy logprobs unscaled; through every dialect."""
    async with GatewayHarness(tmp_path) as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"
        for temperature in (0.7, None, 0.0):
            extra = {} if temperature is None else {"temperature": temperature}
            r = await h.client.post(url, json={"messages": MSGS, **extra})
            assert r.status_code == 200, r.text
        r = await h.client.post(
            f"/episodes/{ep}/v1/messages",
            json={
                "model": "m",
                "max_tokens": 8,
                "temperature": 0.5,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
        assert r.status_code == 200, r.text
        r = await h.client.post(f"/episodes/{ep}/v1/responses", json={"input": "hi", "temperature": 1.3})
        assert r.status_code == 200, r.text
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=5)
        by_seq = {c.call_seq: c for c in calls}
        assert [by_seq[i].temperature for i in range(5)] == [0.7, 1.0, 1.0, 0.5, 1.3]
        assert h.config.requests[0]["temperature"] == 0.7 and "temperature" not in h.config.requests[1]


async def test_a_text_only_upstreams_default_temperature_is_not_known(tmp_path: Path) -> None:
    async with GatewayHarness(tmp_path, kind=UpstreamKind.openai) as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"
        await h.client.post(url, json={"messages": MSGS})
        await h.client.post(url, json={"messages": MSGS, "temperature": 0.7})
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=2)
        assert sorted((c.call_seq, c.temperature) for c in calls) == [(0, None), (1, 0.7)]
