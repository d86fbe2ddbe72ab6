"""Real agent-side libraries through the gateway (uvicorn on loopback, in-process bus, fake engine).

Each client is configured only as a user would: ``base_url`` or ``OPENAI_BASE_URL``/``OPENAI_API_KEY``.
For every call, the recorded event holds token ids and logprobs and the text the client received.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.fakes.gateway_harness import BackgroundGateway
from tests.fakes.upstream import render_prompt

pytestmark = pytest.mark.timeout(60)

TOOL = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "add one to x",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]},
    },
}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with BackgroundGateway(tmp_path_factory.mktemp("gw")) as g:
        yield g


def _faithful(call) -> None:
    assert call.token_faithful and call.prompt_token_ids
    for ch in call.choices:
        assert ch.token_ids and ch.logprobs and len(ch.token_ids) == len(ch.logprobs)


def test_openai_sync_plain_stream_and_tools(gw, monkeypatch):
    ep = gw.open_episode()
    monkeypatch.setenv("OPENAI_BASE_URL", gw.episode_url(ep))
    monkeypatch.setenv("OPENAI_API_KEY", "unused")
    client = openai.OpenAI()
    messages = [{"role": "user", "content": "What is 1+1?"}]
    r1 = client.chat.completions.create(model="policy", messages=messages)
    text1 = r1.choices[0].message.content
    stream = client.chat.completions.create(model="policy", messages=messages, stream=True)
    text2 = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    r3 = client.chat.completions.create(model="policy", messages=messages, tools=[TOOL])
    tool_call = r3.choices[0].message.tool_calls[0]
    r4 = client.chat.completions.create(
        model="policy",
        messages=[
            *messages,
            r3.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": tool_call.id, "content": "2"},
        ],
        tools=[TOOL],
    )
    client.close()
    calls = gw.calls(ep, 4)
    for c in calls:
        _faithful(c)
    assert [c.choices[0].text for c in calls] == [text1, text2, "", r4.choices[0].message.content]
    assert calls[1].streamed and calls[0].prompt_token_ids == render_prompt(messages)
    assert (
        calls[2].choices[0].message["tool_calls"][0]["function"]["name"] == tool_call.function.name == "add"
    )
    assert calls[3].extends_previous is True  # the history was resent verbatim
    assert r1.choices[0].logprobs is None  # the client did not ask for them


def test_openai_async_plain_and_stream_with_n(gw):
    ep = gw.open_episode()

    async def run() -> tuple[list[str], str]:
        client = openai.AsyncOpenAI(base_url=gw.episode_url(ep), api_key="unused")
        msgs = [{"role": "user", "content": "hello"}]
        r = await client.chat.completions.create(
            model="policy", messages=msgs, n=2, logprobs=True, top_logprobs=2
        )
        assert r.choices[0].logprobs is not None and len(r.choices[0].logprobs.content[0].top_logprobs) == 2
        stream = await client.chat.completions.create(model="policy", messages=msgs, stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        await client.close()
        return [c.message.content or "" for c in r.choices], text

    texts, streamed = asyncio.run(run())
    calls = gw.calls(ep, 2)
    for c in calls:
        _faithful(c)
    assert [ch.text for ch in calls[0].choices] == texts and calls[1].choices[0].text == streamed


def test_langchain_chat_openai_with_bound_tools(gw):
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def add(x: int) -> int:
        """add one to x"""
        return x + 1

    ep = gw.open_episode()
    llm = ChatOpenAI(model="policy", base_url=gw.episode_url(ep), api_key="unused", max_retries=0)
    bound = llm.bind_tools([add])
    history = [HumanMessage("add one to 1")]
    ai = bound.invoke(history)
    assert ai.tool_calls and ai.tool_calls[0]["name"] == "add"
    history += [
        ai,
        ToolMessage(str(add.invoke(ai.tool_calls[0]["args"])), tool_call_id=ai.tool_calls[0]["id"]),
    ]
    final = bound.invoke(history)
    streamed = "".join(str(chunk.content) for chunk in bound.stream(history))
    calls = gw.calls(ep, 3)
    for c in calls:
        _faithful(c)
    assert calls[0].choices[0].message["tool_calls"][0]["function"]["name"] == "add"
    assert calls[1].choices[0].text == final.content and calls[2].choices[0].text == streamed


def test_openai_agents_sdk_agent_with_function_tool(gw):
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    seen: list[int] = []

    @function_tool
    def add(x: int) -> int:
        """Add one to x."""
        seen.append(x)
        return x + 1

    ep = gw.open_episode()

    async def run() -> str:
        client = openai.AsyncOpenAI(base_url=gw.episode_url(ep), api_key="unused")
        agent = Agent(
            name="calc",
            instructions="Use the tool.",
            tools=[add],
            model=OpenAIChatCompletionsModel(model="policy", openai_client=client),
        )
        result = await Runner.run(agent, "add one to 1")
        await client.close()
        return str(result.final_output)

    output = asyncio.run(run())
    assert seen == [1]
    calls = gw.calls(ep, 2)
    for c in calls:
        _faithful(c)
    assert calls[0].choices[0].message["tool_calls"][0]["function"]["name"] == "add"
    assert calls[1].choices[0].text == output
