"""Pause/resume around weight updates, driven by control events on the bus and by the admin routes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from schemas import (
    CONTROL,
    InferenceDrained,
    InferenceResumed,
    LLMCallRecorded,
    WeightsActivated,
    WeightUpdateFailed,
    WeightUpdateRequested,
)
from tests.fakes.gateway_harness import ADMIN, GatewayHarness
from tests.fakes.upstream import FakeUpstreamConfig
from tests.fakes.waiting import wait_until

pytestmark = pytest.mark.timeout(30)
MSGS = [{"role": "user", "content": "hi"}]


async def test_weight_update_drains_holds_and_resumes_with_new_version(tmp_path):
    cfg = FakeUpstreamConfig(latency_s=0.3)
    async with GatewayHarness(tmp_path, config=cfg, pause_hold_s=10) as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"
        in_flight = asyncio.create_task(h.client.post(url, json={"messages": MSGS}))
        await wait_until(lambda: h.gateway.admission.in_flight == 1, within_s=5, what="the call in flight")
        await h.bus.publish(CONTROL, WeightUpdateRequested(version=1, drain_timeout_s=5))
        (drained,) = await h.events.wait_for(lambda e: isinstance(e, InferenceDrained))
        assert drained.version == 1 and not drained.timed_out and drained.gateway_id == "gw-test"
        assert (await in_flight).status_code == 200  # the in-flight call finished before the drain
        held = asyncio.create_task(h.client.post(url, json={"messages": MSGS}))
        await asyncio.sleep(0.05)
        assert not held.done()  # new calls wait while paused
        await h.bus.publish(CONTROL, WeightsActivated(version=1))
        (resumed,) = await h.events.wait_for(lambda e: isinstance(e, InferenceResumed))
        assert resumed.version == 1
        assert (await held).status_code == 200
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=2)
        assert sorted(c.weight_version for c in calls) == [0, 1]


async def test_hold_deadline_gives_503_with_retry_after_and_failed_update_keeps_version(tmp_path):
    async with GatewayHarness(tmp_path, pause_hold_s=0.1) as h:
        ep = await h.open_episode()
        await h.bus.publish(CONTROL, WeightUpdateRequested(version=3))
        await h.events.wait_for(lambda e: isinstance(e, InferenceDrained))
        r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 503 and "Retry-After" in r.headers
        assert r.json()["error"]["code"] == "paused"
        await h.bus.publish(CONTROL, WeightUpdateFailed(version=3, serving_version=0, error="oom"))
        await h.events.wait_for(lambda e: isinstance(e, InferenceResumed))
        assert h.gateway.admission.weight_version == 0
        r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        assert r.status_code == 200


async def test_drain_timeout_is_reported(tmp_path):
    cfg = FakeUpstreamConfig(latency_s=1.0)
    async with GatewayHarness(tmp_path, config=cfg) as h:
        ep = await h.open_episode()
        slow = asyncio.create_task(
            h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": MSGS})
        )
        await wait_until(lambda: h.gateway.admission.in_flight == 1, within_s=5, what="the call in flight")
        r = await h.client.post("/admin/pause", json={"version": 2, "drain_timeout_s": 0.05}, headers=ADMIN)
        assert r.json()["timed_out"] is True
        (drained,) = await h.events.wait_for(lambda e: isinstance(e, InferenceDrained))
        assert drained.timed_out
        r = await h.client.post("/admin/resume", json={"version": 2}, headers=ADMIN)
        assert r.json() == {"paused": False, "weight_version": 2}
        assert (await slow).status_code == 200
        state = (await h.client.get("/admin/state", headers=ADMIN)).json()
        assert state["weight_version"] == 2 and state["paused"] is False


async def test_admin_routes_need_the_token(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        for method, path in [
            ("POST", "/admin/pause"),
            ("POST", "/admin/resume"),
            ("GET", "/admin/state"),
            ("POST", "/admin/episodes"),
            ("GET", "/admin/episodes/x"),
        ]:
            r = await h.client.request(method, path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401, path
            assert r.json()["error"]["type"] == "authentication_error"
        assert not h.gateway.admission.paused


async def test_admin_pause_reports_the_calls_it_waited_for_and_returns_by_its_deadline(tmp_path):
    cfg = FakeUpstreamConfig(latency_s=0.3)
    async with GatewayHarness(tmp_path, config=cfg) as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"
        r = await h.client.post("/admin/pause", json={"drain_timeout_s": 5}, headers=ADMIN)
        assert r.json()["in_flight"] == 0 and r.json()["still_in_flight"] == 0 and not r.json()["timed_out"]
        await h.client.post("/admin/resume", json={}, headers=ADMIN)
        # drained: it waited for the one call in flight, which finished
        call = asyncio.create_task(h.client.post(url, json={"messages": MSGS}))
        await wait_until(lambda: h.gateway.admission.in_flight == 1, within_s=5, what="the call in flight")
        r = await h.client.post("/admin/pause", json={"drain_timeout_s": 5}, headers=ADMIN)
        assert {k: r.json()[k] for k in ("in_flight", "still_in_flight", "timed_out")} == {
            "in_flight": 1,
            "still_in_flight": 0,
            "timed_out": False,
        }
        assert (await call).status_code == 200
        await h.client.post("/admin/resume", json={}, headers=ADMIN)
        # past the deadline: it answers then, and says what is still running
        cfg.latency_s = 3.0
        slow = asyncio.create_task(h.client.post(url, json={"messages": MSGS}))
        await wait_until(lambda: h.gateway.admission.in_flight == 1, within_s=5, what="the call in flight")
        started = asyncio.get_running_loop().time()
        r = await h.client.post("/admin/pause", json={"drain_timeout_s": 0.2}, headers=ADMIN)
        assert asyncio.get_running_loop().time() - started < 2.0
        assert {k: r.json()[k] for k in ("in_flight", "still_in_flight", "timed_out")} == {
            "in_flight": 1,
            "still_in_flight": 1,
            "timed_out": True,
        }
        await h.client.post("/admin/resume", json={}, headers=ADMIN)
        assert (await slow).status_code == 200


async def test_an_adapters_update_drains_and_holds_only_its_own_calls(tmp_path: Path) -> None:
    """FLYWHEEL_POLICIES: each policy's calls go to the engine under the adapter's name and wait only for
    that adapter's update; the other adapter's and the base's calls are served meanwhile. Every call
    records its adapter and version next to the base version."""
    cfg = FakeUpstreamConfig(latency_s=0.05)
    async with GatewayHarness(tmp_path, config=cfg, pause_hold_s=10, policies="writer,rewriter") as h:
        ep = await h.open_episode()
        url = f"/episodes/{ep}/v1/chat/completions"

        def ask(model: str) -> asyncio.Task[object]:
            return asyncio.create_task(h.client.post(url, json={"model": model, "messages": MSGS}))

        await h.bus.publish(CONTROL, WeightUpdateRequested(version=1, adapter="writer", drain_timeout_s=5))
        (drained,) = await h.events.wait_for(lambda e: isinstance(e, InferenceDrained))
        assert drained.adapter == "writer" and drained.version == 1
        held = ask("writer")
        served = [await ask("rewriter"), await ask("checker")]  # served while writer is paused
        assert [r.status_code for r in served] == [200, 200]  # type: ignore[attr-defined]
        assert not held.done()
        assert not h.gateway.admission.paused  # the base was never paused
        await h.bus.publish(CONTROL, WeightsActivated(version=1, adapter="writer"))
        (resumed,) = await h.events.wait_for(lambda e: isinstance(e, InferenceResumed))
        assert resumed.adapter == "writer" and resumed.version == 1
        assert (await held).status_code == 200  # type: ignore[attr-defined]
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
    recorded = sorted((c.model, c.adapter, c.adapter_version, c.weight_version) for c in calls)
    assert recorded == [
        ("checker", None, None, 0),  # no policy: the base
        ("rewriter", "rewriter", 0, 0),
        ("writer", "writer", 1, 0),  # admitted after the update: the new version
    ]
    # "checker" is not a name the engine serves: the base is asked for under its served name
    # (gateway/upstream/model_names.py), the adapters under their policies' names
    assert sorted(r["model"] for r in cfg.requests) == ["fake-model", "rewriter", "writer"]


async def test_a_bad_policy_map_stops_the_gateway_with_the_reason(tmp_path: Path) -> None:
    from infra.policies import PolicyMapError

    with pytest.raises(PolicyMapError, match="unknown selector"):
        async with GatewayHarness(tmp_path, policies='{"a": {"modelz": ["x"]}}'):
            pass
