"""An agent that asks for a model the engine does not serve (``gpt-4o-mini``) is served all the same.

Through the real gateway server and the real ``openai`` SDK, in front of a fake upstream that serves only
its names as vLLM does (``policy`` and the adapter ``writer``; any other name is a 404): the upstream is
asked for its served name, the call is recorded with the name the agent asked for, and the answer names
it; a policy's name still goes to its adapter. With ``FLYWHEEL_MODEL_NAMES=passthrough`` the agent's name
goes upstream as it is (and vLLM's 404 reaches the agent). The rule: ``gateway/upstream/model_names.py``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.fakes.gateway_harness import BackgroundGateway
from tests.fakes.upstream import FakeUpstreamConfig

pytestmark = pytest.mark.timeout(60)

MSGS: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _gateway(tmp: Path, mode: str) -> tuple[BackgroundGateway, FakeUpstreamConfig]:
    cfg = FakeUpstreamConfig(use_tools=False, served_names=["policy", "writer"])
    gw = BackgroundGateway(tmp, config=cfg, policies="writer", model="policy", model_names=mode)
    return gw, cfg


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[BackgroundGateway, FakeUpstreamConfig]]:
    gw, cfg = _gateway(tmp_path, "served")
    with gw:
        yield gw, cfg


def test_an_unserved_model_name_is_served_under_the_served_name_and_recorded_as_asked(
    served: tuple[BackgroundGateway, FakeUpstreamConfig],
) -> None:
    gw, cfg = served
    episode = gw.open_episode()
    with openai.OpenAI(base_url=gw.episode_url(episode), api_key="unused", max_retries=0) as client:
        answer = client.chat.completions.create(model="gpt-4o-mini", messages=MSGS, max_tokens=8)
        assert answer.model == "gpt-4o-mini" and answer.choices[0].message.content
        stream = client.chat.completions.create(
            model="gpt-4o-mini",
            messages=MSGS,
            max_tokens=8,
            stream=True,
        )
        chunks = list(stream)
        assert chunks and {c.model for c in chunks} == {"gpt-4o-mini"}
        text = client.completions.create(model="gpt-4o-mini", prompt="2+2=", max_tokens=4)
        assert text.model == "gpt-4o-mini"
        # the served name and a policy's name go as they are: to the base and to the adapter
        assert client.chat.completions.create(model="policy", messages=MSGS).model == "policy"
        assert client.chat.completions.create(model="writer", messages=MSGS).model == "writer"
    assert [r["model"] for r in cfg.requests] == ["policy", "policy", "policy", "policy", "writer"]
    calls = gw.calls(episode, 5)
    assert [c.model for c in calls] == ["gpt-4o-mini"] * 3 + ["policy", "writer"]
    assert [c.adapter for c in calls] == [None, None, None, None, "writer"]
    for call in calls:
        assert call.status_code == 200 and call.error is None
        assert json.loads(call.request)["model"] == call.model  # the agent's body, as it sent it
    # the recorded response is the engine's own: it names the model that served the call
    assert json.loads(calls[0].response or "{}")["model"] == "policy"


def test_bad_model_names_are_still_a_clear_4xx(served: tuple[BackgroundGateway, FakeUpstreamConfig]) -> None:
    gw, cfg = served
    url = gw.episode_url(gw.open_episode())
    for model in ("x" * 600, 5, ["gpt-4o-mini"]):
        r = httpx.post(f"{url}/chat/completions", json={"model": model, "messages": MSGS}, timeout=10)
        assert r.status_code == 422, r.text
        assert r.json()["error"]["param"] == "model"
    assert cfg.requests == []
    # an empty name (or none) is served by the served name, as vLLM serves it
    r = httpx.post(f"{url}/chat/completions", json={"model": "", "messages": MSGS}, timeout=10)
    assert r.status_code == 200 and r.json()["model"] == "policy"


def test_passthrough_sends_the_agents_name_as_it_is(tmp_path: Path) -> None:
    gw, cfg = _gateway(tmp_path, "passthrough")
    with gw:
        episode = gw.open_episode()
        with openai.OpenAI(base_url=gw.episode_url(episode), api_key="unused", max_retries=0) as client:
            with pytest.raises(openai.NotFoundError, match="gpt-4o-mini"):
                client.chat.completions.create(model="gpt-4o-mini", messages=MSGS)
            assert client.chat.completions.create(model="writer", messages=MSGS).model == "writer"
        (failed, ok) = gw.calls(episode, 2)
    assert [r["model"] for r in cfg.requests] == ["gpt-4o-mini", "writer"]
    assert failed.model == "gpt-4o-mini" and failed.status_code == 404
    assert ok.model == "writer" and ok.adapter == "writer"
