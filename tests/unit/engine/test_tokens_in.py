"""Tokens-in, both halves: the gateway's ``prompt_prefix`` (gateway/upstream/tokens_in.py) only for a call that
extends the previous one exactly, and the engine's prompt from it (``EngineServing._extended_prompt``):
the recorded ids, then only what the template adds after the assistant turn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.upstream.tokens_in import prompt_prefix, splice_ids, turn_of
from infra.engine import InferenceEngine
from infra.engine.protocol import ChatCompletionRequest, PromptPrefix
from infra.engine.serving import EngineServing
from schemas import LLMCallRecorded, UpstreamKind
from tests.fakes.gateway_harness import GatewayHarness

pytestmark = pytest.mark.timeout(60)
FIRST: list[dict[str, Any]] = [
    {"role": "system", "content": "Use the tool."},
    {"role": "user", "content": "What is 12+30?"},
]
CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 12, "b": 30}'}}
REPLY: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [CALL]}
TOOL = {"role": "tool", "tool_call_id": "call_1", "content": "42"}


def test_the_gateway_asks_for_a_prefix_only_for_an_exact_extension() -> None:
    turn = turn_of({"messages": FIRST}, {"choices": [{"index": 0, "message": {**REPLY, "refusal": None}}]})
    prompt, responses = [1, 2, 3], [[7, 8, 9]]
    # the agent sends the reply back as it got it (extra fields dropped or null): a prefix
    got = prompt_prefix({"messages": [*FIRST, {**REPLY, "annotations": []}, TOOL]}, turn, prompt, responses)
    assert got == {"messages": 3, "prompt_token_ids": [1, 2, 3], "response_token_ids": [7, 8, 9]}
    edited = {**REPLY, "tool_calls": [{**CALL, "function": {"name": "add", "arguments": '{"a":12,"b":30}'}}]}
    for messages in (
        [*FIRST, edited, TOOL],  # the agent changed the reply
        [{"role": "system", "content": "Other."}, FIRST[1], REPLY, TOOL],  # or the history
        [*FIRST, REPLY],  # nothing after the reply
        [*FIRST[:1], REPLY, TOOL],  # fewer messages before it
    ):
        assert prompt_prefix({"messages": messages}, turn, prompt, responses) is None
    assert prompt_prefix({"messages": [*FIRST, REPLY, TOOL]}, None, prompt, responses) is None
    assert prompt_prefix({"messages": [*FIRST, REPLY, TOOL]}, turn, None, responses) is None
    cut = turn_of(
        {"messages": FIRST}, {"choices": [{"index": 0, "message": REPLY, "finish_reason": "length"}]}
    )
    assert (
        prompt_prefix({"messages": [*FIRST, REPLY, TOOL]}, cut, prompt, responses) is None
    )  # no end of turn


def test_the_vllm_prompt_is_the_recorded_ids_then_what_the_template_adds_after_the_turn() -> None:
    eot, nl = 2, 198
    prefix = {"messages": 3, "prompt_token_ids": [1, 10, 11], "response_token_ids": [50, 51, eot]}
    turn = [1, 10, 11, 60, 61, eot, nl]  # the reply re-rendered otherwise (60, 61), closed by eot + newline
    full = [*turn, 1, 70, 71, eot, nl, 1, 80]  # then the tool's turn and the generation prompt
    assert splice_ids(prefix, turn, full) == [1, 10, 11, 50, 51, eot, nl, 1, 70, 71, eot, nl, 1, 80]
    assert splice_ids(prefix, turn, [*turn[:-1], 199, 1, 80]) is None  # the whole does not extend the turn
    assert splice_ids({**prefix, "response_token_ids": [50, 51]}, turn, full) is None  # reply not ended
    assert splice_ids({**prefix, "response_token_ids": []}, turn, full) is None


async def test_the_engine_starts_from_the_recorded_ids(engine: InferenceEngine) -> None:
    serving = EngineServing(engine)
    tok = engine.tokenizer
    eot = int(tok.convert_tokens_to_ids("<|im_end|>"))
    assert eot in engine.eos_token_ids
    first = serving.chat_prompt(ChatCompletionRequest(messages=FIRST))
    # what the model wrote, in its own spacing (the template would render the arguments otherwise)
    written = [int(i) for i in tok.encode('{"a":12,"b":30}', add_special_tokens=False)] + [eot]
    messages = [*FIRST, REPLY, TOOL]
    prefix = PromptPrefix(messages=3, prompt_token_ids=first, response_token_ids=written)
    ids = serving.chat_prompt(ChatCompletionRequest(messages=messages, prompt_prefix=prefix))
    rendered = serving.chat_prompt(ChatCompletionRequest(messages=messages))
    assert ids[: len(first) + len(written)] == first + written
    assert ids != rendered and serving.prompts_from_ids == 1
    # after the assistant turn: the same text the template renders (its newline, the tool turn, the
    # generation prompt)
    after_reply = "<|im_end|>".join(tok.decode(rendered).split("<|im_end|>")[3:])  # system, user, reply
    assert tok.decode(ids[len(first) + len(written) :]) == after_reply
    # a reply cut short (no end-of-turn token), or a prefix that is not an assistant turn: rendered
    for bad in (
        PromptPrefix(messages=3, prompt_token_ids=first, response_token_ids=written[:-1]),
        PromptPrefix(messages=2, prompt_token_ids=first, response_token_ids=written),
        PromptPrefix(messages=4, prompt_token_ids=first, response_token_ids=written),
    ):
        assert serving.chat_prompt(ChatCompletionRequest(messages=messages, prompt_prefix=bad)) == rendered
    # a reply in the template's own form re-renders to its ids: the rendered prompt, nothing spliced
    canonical = rendered[len(first) : rendered.index(eot, len(first)) + 1]
    same = PromptPrefix(messages=3, prompt_token_ids=first, response_token_ids=canonical)
    assert serving.chat_prompt(ChatCompletionRequest(messages=messages, prompt_prefix=same)) == rendered
    assert serving.prompts_from_ids == 1


async def test_an_agents_own_prompt_prefix_never_reaches_the_engine(tmp_path: Path) -> None:
    """Only the gateway sets ``prompt_prefix``; one in the agent's body is dropped (and recorded as sent)."""
    async with GatewayHarness(tmp_path, kind=UpstreamKind.embedded) as h:
        episode = await h.open_episode()
        forged = {"messages": 1, "prompt_token_ids": [1], "response_token_ids": [2]}
        body = {"model": "policy", "messages": FIRST, "prompt_prefix": forged}
        r = await h.client.post(f"/episodes/{episode}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        assert "prompt_prefix" not in h.config.requests[-1]
        [call] = await h.events.wait_for(lambda e: isinstance(e, LLMCallRecorded))
        assert "prompt_prefix" in call.request
