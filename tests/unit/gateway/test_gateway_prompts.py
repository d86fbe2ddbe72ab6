"""Prompt components at the gateway: substitution, recording, activation on the bus, group pinning."""

from __future__ import annotations

import pytest

from gateway.episodes.registry import EpisodeState
from gateway.prompts import ActivePrompt, PromptStore, substitute
from schemas import (
    CONTROL,
    LLMCallRecorded,
    PromptComponent,
    PromptVersionActivated,
    PromptVersionRequested,
)
from tests.fakes.gateway_harness import GatewayHarness
from tests.fakes.upstream import FakeUpstreamConfig

pytestmark = pytest.mark.timeout(30)

AGENT_SYSTEM = "Use CALC: <expr> then ANSWER: <n>."
BETTER = "Reply CALC: <expr>, then ANSWER: <n>."
SYS = PromptComponent(name="system_prompt", original=AGENT_SYSTEM, text=BETTER)


def _msgs(system: str = AGENT_SYSTEM) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": "What is 2+3?"}]


def test_system_component_is_replaced_by_its_text_and_both_texts_are_recorded():
    data = {"model": "policy", "messages": _msgs(f"  {AGENT_SYSTEM}\n")}
    out = substitute(data, ActivePrompt("p-1", (SYS,)))
    assert out.data["messages"][0] == {"role": "system", "content": BETTER}
    assert out.data["messages"][1] is data["messages"][1]
    assert data["messages"][0]["content"] == f"  {AGENT_SYSTEM}\n"  # the agent's body is never mutated
    assert out.version == "p-1"
    (change,) = out.changes
    assert (change.component, change.message_index, change.original, change.substituted) == (
        "system_prompt",
        0,
        f"  {AGENT_SYSTEM}\n",
        BETTER,
    )


def test_other_system_text_user_text_and_no_active_version_pass_unchanged():
    active = ActivePrompt("p-1", (SYS,))
    other = {"messages": _msgs("You are someone else.")}
    assert substitute(other, active).data is other and substitute(other, active).version is None
    as_user = {"messages": [{"role": "user", "content": AGENT_SYSTEM}]}
    assert substitute(as_user, active).data is as_user  # only system/developer messages match
    plain = {"messages": _msgs()}
    assert substitute(plain, None, b"{}").data is plain


def test_marked_spans_get_the_candidate_or_lose_their_markers():
    text = "Be brief. [[flywheel:rules]]Use tools.[[/flywheel:rules]] Go."
    data = {"messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}
    span = PromptComponent(name="rules", match="span", original="Use tools.", text="Use CALC.")
    active = substitute(data, ActivePrompt("p-2", (span,)))
    assert active.data["messages"][0]["content"] == "Be brief. Use CALC. Go."
    assert active.version == "p-2"
    assert active.changes[0].original == "[[flywheel:rules]]Use tools.[[/flywheel:rules]]"
    bare = substitute(data, None)  # no version: the model still never sees the markers
    assert bare.data["messages"][0]["content"] == "Be brief. Use tools. Go."
    assert bare.version is None and bare.changes[0].substituted == "Use tools."
    completion = substitute({"prompt": text}, ActivePrompt("p-2", (span,)))
    assert completion.data["prompt"] == "Be brief. Use CALC. Go." and completion.version == "p-2"


def _request(version: str | None, text: str = BETTER) -> PromptVersionRequested:
    comps = [PromptComponent(name="system_prompt", original=AGENT_SYSTEM, text=text)] if version else []
    return PromptVersionRequested(prompt_version=version, components=comps, producer="test")


async def test_activation_on_the_bus_substitutes_records_and_answers(tmp_path):
    cfg = FakeUpstreamConfig()
    async with GatewayHarness(tmp_path, config=cfg) as h:
        request = _request("p-better")
        await h.bus.publish(CONTROL, request)
        (ack,) = await h.events.wait_for(lambda e: isinstance(e, PromptVersionActivated))
        assert (ack.prompt_version, ack.gateway_id, ack.request_id) == (
            "p-better",
            "gw-test",
            request.event_id,
        )
        ep = await h.open_episode()
        r = await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": _msgs()})
        assert r.status_code == 200, r.text
        assert cfg.requests[-1]["messages"][0]["content"] == BETTER  # the engine got the candidate
        (call,) = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert call.prompt_version == "p-better"
        assert AGENT_SYSTEM in call.request  # the request as the agent sent it
        assert [(s.original, s.substituted) for s in call.prompt_substitutions] == [(AGENT_SYSTEM, BETTER)]
        assert h.gateway.state()["prompt_version"] == "p-better"


async def test_a_group_keeps_the_version_it_started_under(tmp_path):
    """GRPO groups never mix prompt versions: an activation mid-group serves only new groups."""
    cfg = FakeUpstreamConfig()
    async with GatewayHarness(tmp_path, config=cfg) as h:
        await h.bus.publish(CONTROL, _request("p-one", "first"))
        await h.events.wait_for(lambda e: isinstance(e, PromptVersionActivated))
        a = await h.open_episode(group_id="g-1")
        b = await h.open_episode(group_id="g-1")
        body = {"messages": _msgs()}
        assert (await h.client.post(f"/episodes/{a}/v1/chat/completions", json=body)).status_code == 200
        await h.bus.publish(CONTROL, _request("p-two", "second"))
        await h.events.wait_for(lambda e: isinstance(e, PromptVersionActivated), count=2)
        assert (await h.client.post(f"/episodes/{b}/v1/chat/completions", json=body)).status_code == 200
        c = await h.open_episode(group_id="g-2")
        assert (await h.client.post(f"/episodes/{c}/v1/chat/completions", json=body)).status_code == 200
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=3)
        version = {call.episode_id: call.prompt_version for call in calls}
        assert version[a] == version[b] == "p-one"  # b's first call came after the activation
        assert version[c] == "p-two"
        assert [r["messages"][0]["content"] for r in cfg.requests] == ["first", "first", "second"]


def test_an_episode_without_a_group_keeps_its_pin_on_itself_and_groups_share_theirs():
    """An episode's own pin lives on its state (forgotten with it); only groups are in the store's map."""
    store = PromptStore(None, max_pins=2)
    first = ActivePrompt("p-one", (SYS,))
    store.active = first
    lone = EpisodeState("e-lone")
    assert store.for_episode(lone) is first
    store.active = ActivePrompt("p-two", (SYS,))
    assert store.for_episode(lone) is first  # pinned at its first call
    assert store.for_episode(EpisodeState("e-new")) is store.active
    a, b = EpisodeState("e-a", group_id="g-1"), EpisodeState("e-b", group_id="g-1")
    assert store.for_episode(a) is store.active
    store.active = None
    assert store.for_episode(b) is a.prompt_pin  # the group's pin, though b started after
    for n in range(3):  # the map is bounded: g-1 is the least recently used and goes
        store.for_episode(EpisodeState(f"e-{n}", group_id=f"g-other-{n}"))
    assert store.for_episode(EpisodeState("e-c", group_id="g-1")) is None
    assert len(store._pins) == 2


async def test_the_active_version_survives_a_gateway_restart_and_can_be_cleared(tmp_path):
    async with GatewayHarness(tmp_path) as h:
        await h.bus.publish(CONTROL, _request("p-kept"))
        await h.events.wait_for(lambda e: isinstance(e, PromptVersionActivated))
    cfg = FakeUpstreamConfig()
    async with GatewayHarness(tmp_path, config=cfg) as h:
        assert h.gateway.state()["prompt_version"] == "p-kept"
        ep = await h.open_episode()
        assert (
            await h.client.post(f"/episodes/{ep}/v1/chat/completions", json={"messages": _msgs()})
        ).status_code == 200
        assert cfg.requests[-1]["messages"][0]["content"] == BETTER
        await h.bus.publish(CONTROL, _request(None))
        await h.events.wait_for(lambda e: isinstance(e, PromptVersionActivated) and e.prompt_version is None)
        ep2 = await h.open_episode()
        assert (
            await h.client.post(f"/episodes/{ep2}/v1/chat/completions", json={"messages": _msgs()})
        ).status_code == 200
        assert cfg.requests[-1]["messages"][0]["content"] == AGENT_SYSTEM
        calls = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded), count=2)
        assert {c.episode_id: c.prompt_version for c in calls} == {ep: "p-kept", ep2: None}
