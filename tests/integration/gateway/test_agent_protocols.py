"""The Responses API and Anthropic's Messages API at the gateway, driven by the official SDKs.

uvicorn on loopback, the in-process bus, the fake engine (tests/fakes/upstream.py: token ids and
logprobs, a tool call whenever tools are offered and no tool result is in the conversation). Each call
is served as one chat call: recorded token-faithfully, with the agent's request and the response as the
agent got it; ``previous_response_id`` and re-sent history extend the trajectory.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from tests.fakes.gateway_harness import BackgroundGateway

pytestmark = pytest.mark.timeout(60)

FN_TOOL = {
    "type": "function",
    "name": "add",
    "description": "add one to x",
    "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
}
ANTHROPIC_TOOL = {
    "name": "add",
    "description": "add one to x",
    "input_schema": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory) -> Any:
    with BackgroundGateway(tmp_path_factory.mktemp("gw")) as g:
        yield g


def _faithful(call: Any, endpoint: str) -> None:
    assert call.endpoint == endpoint and call.token_faithful and call.prompt_token_ids
    for ch in call.choices:
        assert ch.token_ids and ch.logprobs and len(ch.token_ids) == len(ch.logprobs)


def test_responses_plain_streamed_tools_and_previous_response_id(gw: Any) -> None:
    ep = gw.open_episode()
    client = openai.OpenAI(base_url=gw.episode_url(ep), api_key="unused", max_retries=0)
    r1 = client.responses.create(model="policy", instructions="Be brief.", input="What is 1+1?")
    assert r1.status == "completed" and r1.output_text == "The answer is 42."
    assert r1.usage is not None and r1.usage.output_tokens > 0

    events = list(client.responses.create(model="policy", input="What is 1+1?", stream=True))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-1] == "response.completed" and "response.output_text.delta" in kinds
    assert [e.sequence_number for e in events] == list(range(len(events)))
    streamed = events[-1].response  # type: ignore[union-attr]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")  # type: ignore[union-attr]
    assert streamed.output_text == deltas == "The answer is 42."

    r3 = client.responses.create(model="policy", input="add one to 1", tools=[FN_TOOL])  # type: ignore[list-item]
    [call_item] = r3.output
    assert call_item.type == "function_call" and call_item.name == "add" and call_item.arguments == '{"x": 1}'
    # the tool result by previous_response_id: the gateway holds the conversation
    r4 = client.responses.create(
        model="policy",
        previous_response_id=r3.id,
        input=[{"type": "function_call_output", "call_id": call_item.call_id, "output": "2"}],
        tools=[FN_TOOL],  # type: ignore[list-item]
    )
    assert r4.output_text == "The answer is 42." and r4.previous_response_id == r3.id
    # the same conversation re-sent as items, streamed
    items: list[Any] = [
        {"role": "user", "content": "add one to 1"},
        *[o.model_dump(exclude_none=True) for o in r3.output],
        {"type": "function_call_output", "call_id": call_item.call_id, "output": "2"},
    ]
    with client.responses.stream(model="policy", input=items, tools=[FN_TOOL]) as stream:  # type: ignore[list-item]
        final = stream.get_final_response()
    assert final.output_text == "The answer is 42."
    client.close()

    calls = gw.calls(ep, 5)
    for c in calls:
        _faithful(c, "responses")
    assert [c.streamed for c in calls] == [False, True, False, False, True]
    assert json.loads(calls[0].request)["instructions"] == "Be brief."  # the agent's own request
    assert json.loads(calls[0].response)["id"] == r1.id  # the response as the agent got it
    assert json.loads(calls[1].response)["output"][0]["content"][0]["text"] == deltas
    assert calls[2].choices[0].message["tool_calls"][0]["function"]["name"] == "add"
    assert calls[3].extends_previous is True and not calls[3].prefix_mismatch
    assert calls[4].extends_previous is False  # a new conversation after r4's: not r4's extension


def test_responses_streamed_tool_call(gw: Any) -> None:
    ep = gw.open_episode()
    client = openai.OpenAI(base_url=gw.episode_url(ep), api_key="unused", max_retries=0)
    events = list(client.responses.create(model="policy", input="add one", tools=[FN_TOOL], stream=True))  # type: ignore[list-item]
    kinds = [e.type for e in events]
    assert "response.function_call_arguments.delta" in kinds and kinds[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [(d.name, d.arguments) for d in done] == [("add", '{"x": 1}')]  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert [o.type for o in final.output] == ["function_call"]
    client.close()
    [call] = gw.calls(ep, 1)
    _faithful(call, "responses")


def test_responses_errors_are_openai_format_4xx(gw: Any) -> None:
    ep = gw.open_episode()
    other = gw.open_episode()
    client = openai.OpenAI(base_url=gw.episode_url(ep), api_key="unused", max_retries=0)
    r = client.responses.create(model="policy", input="hi")
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"previous_response_id": "resp_nope", "input": "hi"}, 404, "previous_response_id"),
        ({"input": [{"type": "item_reference", "id": "x"}]}, 400, "input[0].type"),
        ({"input": [{"type": "function_call", "name": "f"}]}, 400, "input[0].call_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, 400, "tools[0].type"),
        ({"input": "hi", "background": True}, 400, "background"),
        ({"input": "hi", "conversation": "conv_1"}, 400, "conversation"),
        ({"input": 5}, 422, "input.str"),
        ({}, 400, "input"),
    ]
    for body, status, param in cases:
        with pytest.raises(openai.APIStatusError) as info:
            client.responses.create(model="policy", **body)
        assert info.value.status_code == status, body
        err = info.value.body
        assert isinstance(err, dict) and err["param"] == param, err
        assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error"), err
    # a response of one episode is not visible from another
    elsewhere = openai.OpenAI(base_url=gw.episode_url(other), api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError):
        elsewhere.responses.create(model="policy", previous_response_id=r.id, input="again")
    client.close()
    elsewhere.close()


def test_responses_production_previous_response_id_continues_the_session(gw: Any) -> None:
    _, key = gw.h.keystore.create("acme-responses")
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key=key, max_retries=0)
    r1 = client.responses.with_raw_response.create(model="policy", input="hi")
    r2 = client.responses.with_raw_response.create(
        model="policy", input="and again", previous_response_id=r1.parse().id
    )
    assert r1.headers["x-flywheel-episode"] == r2.headers["x-flywheel-episode"]
    calls = gw.calls(r1.headers["x-flywheel-episode"], 2)
    assert calls[1].extends_previous is True and calls[0].tenant == "acme-responses"
    with (
        openai.OpenAI(base_url=f"{gw.url}/v1", api_key="wrong", max_retries=0) as wrong,
        pytest.raises(openai.AuthenticationError),
    ):
        wrong.responses.create(model="policy", input="hi")
    client.close()


def test_messages_plain_streamed_and_tool_loop(gw: Any) -> None:
    ep = gw.open_episode()
    base = gw.episode_url(ep).removesuffix("/v1")  # ANTHROPIC_BASE_URL carries no /v1
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    m1 = client.messages.create(
        model="policy", max_tokens=64, system="Be brief.", messages=[{"role": "user", "content": "1+1?"}]
    )
    assert m1.stop_reason == "end_turn" and [b.type for b in m1.content] == ["text"]
    assert m1.content[0].text == "The answer is 42." and m1.usage.output_tokens > 0  # type: ignore[union-attr]
    with client.messages.stream(
        model="policy", max_tokens=64, messages=[{"role": "user", "content": "1+1?"}]
    ) as stream:
        text = "".join(stream.text_stream)
        m2 = stream.get_final_message()
    assert text == "The answer is 42." and m2.stop_reason == "end_turn"

    history: list[Any] = [{"role": "user", "content": [{"type": "text", "text": "add one to 1"}]}]
    m3 = client.messages.create(model="policy", max_tokens=64, messages=history, tools=[ANTHROPIC_TOOL])  # type: ignore[list-item]
    assert m3.stop_reason == "tool_use"
    [use] = [b for b in m3.content if b.type == "tool_use"]
    assert use.name == "add" and use.input == {"x": 1}  # type: ignore[union-attr]
    history += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m3.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "2"}]},  # type: ignore[union-attr]
    ]
    with client.messages.stream(model="policy", max_tokens=64, messages=history, tools=[ANTHROPIC_TOOL]) as s:  # type: ignore[list-item]
        m4 = s.get_final_message()
    assert m4.stop_reason == "end_turn" and m4.content[0].text == "The answer is 42."  # type: ignore[union-attr]
    with client.messages.stream(
        model="policy", max_tokens=64, messages=history[:1], tools=[ANTHROPIC_TOOL]
    ) as s:  # type: ignore[list-item]
        m5 = s.get_final_message()
    assert [b.type for b in m5.content] == ["tool_use"] and m5.content[0].input == {"x": 1}  # type: ignore[union-attr]
    client.close()

    calls = gw.calls(ep, 5)
    for c in calls:
        _faithful(c, "messages")
    assert [c.streamed for c in calls] == [False, True, False, True, True]
    assert json.loads(calls[0].request)["system"] == "Be brief."
    assert json.loads(calls[0].response)["id"] == m1.id
    assert json.loads(calls[3].response)["content"][0]["text"] == "The answer is 42."
    assert calls[3].extends_previous is True  # the tool_use block re-rendered to the generated ids


def test_messages_errors_and_keys(gw: Any) -> None:
    ep = gw.open_episode()
    base = gw.episode_url(ep).removesuffix("/v1")
    client = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    user = [{"role": "user", "content": "hi"}]
    cases: list[tuple[dict[str, Any], str]] = [
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "document"),
        (
            {"max_tokens": 8, "messages": user, "tools": [{"type": "web_search_20250305", "name": "w"}]},
            "tools",
        ),
        (
            {"max_tokens": 8, "messages": user, "thinking": {"type": "enabled", "budget_tokens": 1024}},
            "thinking",
        ),
        ({"max_tokens": 8, "messages": user, "extra_body": {"mcp_servers": [{"url": "x"}]}}, "mcp_servers"),
        ({"max_tokens": 8, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"max_tokens": 0, "messages": user}, "max_tokens"),
    ]
    for body, named in cases:
        with pytest.raises(anthropic.APIStatusError) as info:
            client.messages.create(model="policy", **body)
        assert 400 <= info.value.status_code < 500
        err = info.value.body
        assert isinstance(err, dict) and err["type"] == "error", err
        assert err["error"]["type"] == "invalid_request_error" and named in err["error"]["message"], err
    client.close()
    # production: Flywheel's tenant keys, as x-api-key (the SDK's default) or as a bearer token
    _, key = gw.h.keystore.create("acme-messages")
    with httpx.Client(base_url=gw.url, timeout=30) as http:
        for headers in ({"x-api-key": key}, {"Authorization": f"Bearer {key}"}):
            r = http.post(
                "/v1/messages", json={"model": "policy", "max_tokens": 8, "messages": user}, headers=headers
            )
            assert r.status_code == 200 and r.json()["type"] == "message"
            assert r.headers["x-flywheel-episode"]
        r = http.post("/v1/messages", json={"max_tokens": 8, "messages": user}, headers={"x-api-key": "nope"})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        r = http.post("/v1/messages", content=b"{not json", headers={"x-api-key": key})
        assert r.status_code == 400 and r.json()["type"] == "error"
