"""The gateway in front of a live vLLM: what the real ``openai`` SDK sends is recorded with the token ids and
logprobs vLLM returned — chat, streaming, ``n > 1``, text completions, token-id prompts, tool calls.

Every recorded prompt is checked against the served model's own tokenizer and chat template (rendered
here with transformers, independently of vLLM), every completion's ids against the text the client got.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from schemas import LLMCallRecorded, LogprobsMode, UpstreamKind
from tests.fakes.gateway_harness import BackgroundGateway
from tests.vllm.conftest import SERVED_NAME

pytestmark = pytest.mark.timeout(600)

TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "description": "Multiply two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def gw(warm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackgroundGateway]:
    with BackgroundGateway(
        tmp_path_factory.mktemp("gw"), upstream_url=warm + "/v1", upstream_timeout_s=300.0
    ) as g:
        yield g


@pytest.fixture(scope="module")
def tokenizer(vllm_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(vllm_model_dir)


@pytest.fixture
def client(gw: BackgroundGateway) -> Iterator[tuple[openai.OpenAI, str]]:
    episode = gw.open_episode()
    with openai.OpenAI(base_url=gw.episode_url(episode), api_key="unused", max_retries=0) as c:
        yield c, episode


def rendered(tokenizer: Any, messages: list[dict[str, Any]], tools: list[Any] | None = None) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def assert_faithful(call: LLMCallRecorded, tokenizer: Any, texts: list[str]) -> None:
    """Token ids and processed logprobs for the prompt and every choice, from vLLM, matching the text."""
    assert call.upstream is UpstreamKind.vllm and call.status_code == 200
    assert call.token_faithful and call.prompt_token_ids
    assert call.logprobs_mode is LogprobsMode.processed
    assert [c.text for c in call.choices] == texts
    for choice, text in zip(call.choices, texts, strict=True):
        ids, lps = choice.token_ids or [], choice.logprobs or []
        assert len(ids) == len(lps) > 0 and all(-1e4 < lp <= 0.0 for lp in lps)
        decoded = tokenizer.decode(ids, skip_special_tokens=True)
        # a reply cut inside a multi-byte character: vLLM holds the incomplete bytes back from the text
        assert decoded == text or (decoded.startswith(text) and set(decoded[len(text) :]) == {"\ufffd"})


def test_chat_is_recorded_with_vllms_ids_and_logprobs(client, gw, tokenizer) -> None:
    c, episode = client
    r = c.chat.completions.create(model=SERVED_NAME, messages=QUESTION, max_tokens=12, temperature=1.0)
    [call] = gw.calls(episode, 1, within_s=30)
    text = r.choices[0].message.content or ""
    assert_faithful(call, tokenizer, [text])
    assert call.prompt_token_ids == rendered(tokenizer, QUESTION)
    assert r.choices[0].logprobs is None  # the agent did not ask for them; the gateway did
    # vLLM 0.32 ignores return_weight_versions on /v1: the gateway stamps the version it admitted under
    assert call.choices[0].weight_versions is None and call.weight_version == 0
    assert call.weight_version_source == "gateway"


def test_streamed_chat_and_n_choices(client, gw, tokenizer) -> None:
    c, episode = client
    stream = c.chat.completions.create(
        model=SERVED_NAME, messages=QUESTION, max_tokens=12, stream=True, temperature=1.0
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    r = c.chat.completions.create(
        model=SERVED_NAME, messages=QUESTION, max_tokens=8, n=2, temperature=1.0, logprobs=True
    )
    first, second = gw.calls(episode, 2, within_s=30)
    assert first.streamed and not second.streamed
    assert_faithful(first, tokenizer, [streamed])
    assert_faithful(second, tokenizer, [ch.message.content or "" for ch in r.choices])
    # what the agent asked for it got, and it is what was recorded
    for got, recorded in zip(r.choices, second.choices, strict=True):
        assert got.logprobs is not None and got.logprobs.content is not None
        assert [t.logprob for t in got.logprobs.content] == pytest.approx(recorded.logprobs)


def test_completions_with_text_and_token_id_prompts(client, gw, tokenizer) -> None:
    c, episode = client
    prompt = "The capital of France is"
    r1 = c.completions.create(model=SERVED_NAME, prompt=prompt, max_tokens=8, temperature=1.0)
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    r2 = c.completions.create(
        model=SERVED_NAME,
        prompt=ids,
        max_tokens=8,
        temperature=1.0,
        extra_body={"add_special_tokens": False},
    )
    text_call, ids_call = gw.calls(episode, 2, within_s=30)
    assert text_call.endpoint == ids_call.endpoint == "completions"
    assert_faithful(text_call, tokenizer, [r1.choices[0].text])
    assert_faithful(ids_call, tokenizer, [r2.choices[0].text])
    assert text_call.prompt_token_ids == ids_call.prompt_token_ids == ids


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_tool_calls_are_parsed_by_vllm_and_recorded(client, gw, tokenizer, stream: bool) -> None:
    """The model writes a hermes ``<tool_call>`` (the format its chat template shows it), vLLM's hermes
    parser turns it into ``tool_calls`` (streamed or not), the event records them with the ids of what
    the model wrote, and the tool result sent back renders through the template (``<tool_response>``).
    vLLM 0.32 does not constrain a named ``tool_choice`` when a tool parser is set: the arguments are
    whatever JSON SmolLM2 wrote, not necessarily the tool's schema."""
    c, episode = client
    ask = [{"role": "user", "content": "Use the tool: what is 6 times 7?"}]
    forced = {"type": "function", "function": {"name": "multiply"}}
    kwargs: dict[str, Any] = {"model": SERVED_NAME, "tools": [TOOL], "max_tokens": 40, "temperature": 0.0}
    if stream:
        name, args, call_id = "", "", ""
        for chunk in c.chat.completions.create(messages=ask, tool_choice=forced, stream=True, **kwargs):
            for delta in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                name += delta.function.name or "" if delta.function else ""
                args += delta.function.arguments or "" if delta.function else ""
                call_id = delta.id or call_id
    else:
        r = c.chat.completions.create(messages=ask, tool_choice=forced, **kwargs)
        [tc] = r.choices[0].message.tool_calls or []
        name, args, call_id = tc.function.name, tc.function.arguments, tc.id
    assert name == "multiply" and call_id
    json.loads(args)  # valid JSON

    def assistant(arguments: str) -> dict[str, Any]:
        call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    history = [*ask, assistant(args), {"role": "tool", "tool_call_id": call_id, "content": "42"}]
    final = c.chat.completions.create(messages=history, **kwargs)
    tool_call, answer = gw.calls(episode, 2, within_s=30)
    assert tool_call.streamed is stream and tool_call.token_faithful
    recorded = tool_call.choices[0].message
    assert isinstance(recorded, dict)
    [rec] = recorded["tool_calls"]
    assert rec["function"]["name"] == "multiply" and json.loads(rec["function"]["arguments"]) == json.loads(
        args
    )
    # what the model wrote, as its ids decode: the tool call the parser read
    written = tokenizer.decode(tool_call.choices[0].token_ids, skip_special_tokens=True)
    assert "<tool_call>" in written and '"multiply"' in written
    # tokens-in: the answer's prompt is the tool call's prompt and the ids the model wrote, then only
    # what the template adds after that turn (the newline after <|im_end|>, the tool's turn, the
    # generation prompt), not the template's rendering of the parsed tool call
    head = [*(tool_call.prompt_token_ids or []), *(tool_call.choices[0].token_ids or [])]
    assert answer.extends_previous is True and answer.prompt_token_ids is not None
    assert answer.prompt_token_ids[: len(head)] == head
    turn = tokenizer.apply_chat_template(
        history[:2], tools=[TOOL], add_generation_prompt=False, tokenize=True
    )
    turn = list(turn["input_ids"] if hasattr(turn, "keys") else turn)
    full = rendered(tokenizer, history, tools=[TOOL])
    assert full[: len(turn)] == turn and turn[-2] == tool_call.choices[0].token_ids[-1]  # <|im_end|>, newline
    assert answer.prompt_token_ids[len(head) :] == full[len(turn) - 1 :]
    assert_faithful(answer, tokenizer, [final.choices[0].message.content or ""])


def test_tokens_in_a_call_extends_the_previous_one_by_the_ids_vllm_returned(client, gw, tokenizer) -> None:
    """A forced tool call is written by the model as bare JSON arguments; vLLM's parser returns it as a
    tool call, which the template renders as a ``<tool_call>`` block the model never wrote. The gateway
    sends the next call's prompt as ids (``kv_transfer_params.prompt_token_ids``, from vLLM's own
    ``/tokenize`` around the recorded ids), so it extends the previous call token for token, where the
    template's rendering of the same conversation does not."""
    c, episode = client
    ask = [
        {"role": "system", "content": "You call tools."},
        {"role": "user", "content": "What is 6 times 7?"},
    ]
    forced = {"type": "function", "function": {"name": "multiply"}}
    first = c.chat.completions.create(
        model=SERVED_NAME,
        messages=ask,
        tools=[TOOL],
        tool_choice=forced,
        max_tokens=128,
        temperature=0.5,
        seed=0,
    )
    choice = first.choices[0]
    assert choice.finish_reason != "length", "the forced call must end on its own for tokens-in to apply"
    [tc] = choice.message.tool_calls or []
    reply = {"role": "assistant", "content": None, "tool_calls": [tc.model_dump()]}
    history = [*ask, reply, {"role": "tool", "tool_call_id": tc.id, "content": "42"}]
    c.chat.completions.create(
        model=SERVED_NAME, messages=history, tools=[TOOL], max_tokens=8, temperature=0.5
    )
    before, after = gw.calls(episode, 2, within_s=30)
    head = [*(before.prompt_token_ids or []), *(before.choices[0].token_ids or [])]
    assert after.extends_previous is True and (after.prompt_token_ids or [])[: len(head)] == head
    assert after.prompt_token_ids != rendered(tokenizer, history, tools=[TOOL])


def test_responses_and_messages_apis_are_recorded_with_vllms_ids(gw, tokenizer) -> None:
    """The OpenAI Responses API and Anthropic's Messages API through the gateway to vLLM: each served as
    one chat call, recorded with vLLM's ids and logprobs, the text the SDK got what the ids decode to;
    a ``previous_response_id`` follow-up resolves to the first call's conversation."""
    import anthropic

    episode = gw.open_episode()
    with openai.OpenAI(base_url=gw.episode_url(episode), api_key="unused", max_retries=0) as c:
        first = c.responses.create(model=SERVED_NAME, input="Name a colour.", max_output_tokens=8)
        second = c.responses.create(
            model=SERVED_NAME, input="And another.", previous_response_id=first.id, max_output_tokens=8
        )
    base = gw.episode_url(episode).removesuffix("/v1")
    with anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0) as a:
        msg = a.messages.create(
            model=SERVED_NAME, max_tokens=8, messages=[{"role": "user", "content": "Name a fruit."}]
        )
    calls = gw.calls(episode, 3, within_s=30)
    texts = [first.output_text, second.output_text, "".join(b.text for b in msg.content if b.type == "text")]
    assert [c.endpoint for c in calls] == ["responses", "responses", "messages"]
    for call, text in zip(calls, texts, strict=True):
        assert_faithful(call, tokenizer, [text])
    assert calls[1].prompt_token_ids[: len(calls[0].prompt_token_ids)] == calls[0].prompt_token_ids
