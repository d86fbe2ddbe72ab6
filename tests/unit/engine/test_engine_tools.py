"""Tool calls from the embedded engine (Hermes format), whole and streamed, and test-only forced outputs."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
import torch

from infra.engine import InferenceEngine
from infra.engine.app import create_engine_app
from infra.engine.forcing import scripted_replies
from infra.engine.sampling import processed_logprobs
from infra.engine.tools import ToolCallStream, parse_tool_calls

pytestmark = pytest.mark.timeout(120)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]


def test_parse_tool_calls() -> None:
    content, calls = parse_tool_calls(
        'Let me.\n<tool_call>\n{"name": "calc", "arguments": {"e": "1+2"}}\n</tool_call>'
    )
    assert content == "Let me." and calls[0]["function"] == {"name": "calc", "arguments": '{"e": "1+2"}'}
    assert calls[0]["id"].startswith("chatcmpl-tool-") and calls[0]["type"] == "function"
    assert parse_tool_calls("<tool_call>{broken</tool_call>") == ("<tool_call>{broken</tool_call>", [])
    assert parse_tool_calls('<tool_call>{"arguments": {}}</tool_call>')[1] == []  # no name: plain text
    two = parse_tool_calls(CALL + "\n" + CALL.replace("6", "8"))
    assert two[0] is None and [json.loads(c["function"]["arguments"])["a"] for c in two[1]] == [6, 8]


def test_tool_call_stream_holds_back_a_tag_prefix_and_parses_at_the_end() -> None:
    s = ToolCallStream()
    text = "Sure. " + CALL
    out = "".join(s.push(text[i : i + 3]) for i in range(0, len(text), 3))
    assert out == "Sure. "  # never a piece of "<tool_call>"
    rest, calls = s.finish(text, parse=True)
    assert rest == "" and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "multiply"
    plain = ToolCallStream()
    sent = plain.push("a <tool") + plain.push("box> b")  # looked like a tag, was not
    assert sent + plain.finish("a <toolbox> b", parse=True)[0] == "a <toolbox> b"
    broken = ToolCallStream()
    assert broken.push("<tool_call>{oops") == ""
    assert broken.finish("<tool_call>{oops", parse=True) == ("<tool_call>{oops", [])


@pytest.fixture
async def forced_engine(tiny_model_dir: Path) -> AsyncIterator[InferenceEngine]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)

    def script(prompt: str) -> str | None:
        if "<tools>" not in prompt:
            return None  # sample
        return "The answer is 42." if "<tool_response>" in prompt else CALL

    eng = InferenceEngine.from_pretrained(
        tiny_model_dir, max_model_len=2048, forced_output=scripted_replies(tok, script)
    )
    yield eng
    await eng.close()


@pytest.fixture
async def client(forced_engine: InferenceEngine) -> AsyncIterator[openai.AsyncOpenAI]:
    transport = httpx.ASGITransport(app=create_engine_app(forced_engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as http:
        yield openai.AsyncOpenAI(
            base_url="http://engine/v1", api_key="unused", http_client=http, max_retries=0
        )


async def test_forced_tokens_carry_the_models_own_logprobs(forced_engine: InferenceEngine) -> None:
    tok = forced_engine.tokenizer
    prompt = [
        int(i)
        for i in tok.apply_chat_template(MESSAGES, tools=TOOLS, add_generation_prompt=True, return_dict=False)
    ]
    from infra.engine.sampling import SamplingParams

    result = await forced_engine.complete(prompt, SamplingParams(temperature=0.7, logprobs=2))
    [choice] = result.choices
    assert choice.text == CALL and choice.finish_reason == "stop"
    assert choice.token_ids == [*tok.encode(CALL, add_special_tokens=False), tok.eos_token_id]
    with torch.no_grad():
        logits = forced_engine.model(torch.tensor([prompt + choice.token_ids])).logits[0].float()
    steps = logits[len(prompt) - 1 : -1]
    n = len(choice.token_ids)
    lps = processed_logprobs(steps, torch.full((n,), 0.7), torch.zeros(n, dtype=torch.long), torch.ones(n))
    expected = lps.gather(1, torch.tensor(choice.token_ids).unsqueeze(1)).squeeze(1)
    assert torch.allclose(torch.tensor(choice.logprobs), expected, atol=1e-4)
    assert all(len(top) == 2 for top in choice.top_logprobs)
    unforced = await forced_engine.complete(
        [int(i) for i in tok.apply_chat_template(MESSAGES, add_generation_prompt=True, return_dict=False)],
        SamplingParams(max_tokens=4, ignore_eos=True, seed=1),
    )
    assert len(unforced.choices[0].token_ids) == 4  # no tools in the prompt: sampled as usual


async def test_tool_calls_whole_and_streamed(
    client: openai.AsyncOpenAI, forced_engine: InferenceEngine
) -> None:
    whole = await client.chat.completions.create(model="policy", messages=MESSAGES, tools=TOOLS)  # type: ignore[arg-type]
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls" and msg.content is None
    assert msg.tool_calls and msg.tool_calls[0].function.name == "multiply"
    assert json.loads(msg.tool_calls[0].function.arguments) == {"a": 6, "b": 7}
    stream = await client.chat.completions.create(
        model="policy",
        messages=MESSAGES,
        tools=TOOLS,
        stream=True,
        extra_body={"return_token_ids": True},  # type: ignore[arg-type]
    )
    content, deltas, finish, ids = "", [], None, []
    async for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            deltas += ch.delta.tool_calls or []
            finish = ch.finish_reason or finish
            ids += (ch.model_extra or {}).get("token_ids") or []
    assert content == "" and finish == "tool_calls" and len(deltas) == 1
    assert deltas[0].function.name == "multiply" and json.loads(deltas[0].function.arguments) == {
        "a": 6,
        "b": 7,
    }
    tok = forced_engine.tokenizer
    assert ids == [*tok.encode(CALL, add_special_tokens=False), tok.eos_token_id]  # every token still sent
    history = [
        *MESSAGES,
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": msg.tool_calls[0].id, "content": "42"},
    ]
    final = await client.chat.completions.create(model="policy", messages=history, tools=TOOLS, stream=True)  # type: ignore[arg-type]
    text = "".join([c.choices[0].delta.content or "" async for c in final if c.choices])
    assert text == "The answer is 42."
    none = await client.chat.completions.create(
        model="policy", messages=MESSAGES, tools=TOOLS, tool_choice="none"
    )  # type: ignore[arg-type]
    assert none.choices[0].message.content == CALL and not none.choices[0].message.tool_calls
