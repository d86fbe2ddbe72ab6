"""An agent written for a hosted API asks a live vLLM for ``gpt-4o-mini`` through the gateway, and is served.

vLLM serves only the names it was started with (``policy``) and answers any other with a 404; the gateway
sends such a call under the name vLLM lists as its base (gateway/upstream/model_names.py), records the
call with the name the agent asked for, and answers with that name. Asked directly, vLLM refuses it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from schemas import UpstreamKind
from tests.fakes.gateway_harness import BackgroundGateway
from tests.vllm.conftest import SERVED_NAME

pytestmark = pytest.mark.timeout(600)

QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gw(warm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundGateway]:
    with BackgroundGateway(
        tmp_path_factory.mktemp("gw"), upstream_url=warm + "/v1", upstream_timeout_s=300.0
    ) as g:
        yield g


def test_vllm_itself_refuses_a_name_it_does_not_serve(warm: str) -> None:
    body = {"model": "gpt-4o-mini", "messages": QUESTION, "max_tokens": 4}
    r = httpx.post(warm + "/v1/chat/completions", json=body, timeout=60.0)
    assert r.status_code == 404, r.text


def test_the_openai_sdk_asking_for_gpt_4o_mini_is_served_by_vllm(gw: BackgroundGateway) -> None:
    episode = gw.open_episode()
    with openai.OpenAI(base_url=gw.episode_url(episode), api_key="unused", max_retries=0) as client:
        answer = client.chat.completions.create(
            model="gpt-4o-mini", messages=QUESTION, max_tokens=12, temperature=0.0
        )
        assert answer.model == "gpt-4o-mini"
        assert answer.choices[0].message.content
        chunks = list(
            client.chat.completions.create(
                model="gpt-4o-mini", messages=QUESTION, max_tokens=12, temperature=0.0, stream=True
            )
        )
        assert {c.model for c in chunks} == {"gpt-4o-mini"}
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = gw.calls(episode, 2, within_s=60.0)
    for call in calls:
        assert call.status_code == 200 and call.error is None
        assert call.model == "gpt-4o-mini" and json.loads(call.request)["model"] == "gpt-4o-mini"
        assert call.upstream is UpstreamKind.vllm and call.token_faithful
        assert call.choices and call.choices[0].token_ids
    # vLLM's own answer, as recorded, names the model that served the call
    assert json.loads(calls[0].response or "{}")["model"] == SERVED_NAME
