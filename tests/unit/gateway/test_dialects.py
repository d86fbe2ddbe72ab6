"""The Responses and Messages translations without HTTP: request → chat, chat → the protocol's body and
stream events (checked against the official SDKs' own types), and the bounded response store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import TypeAdapter

from gateway.episodes.registry import EpisodeState
from gateway.errors import InvalidRequestError, NotFoundError
from gateway.protocols.anthropic import MessagesExchange
from gateway.protocols.response_store import Kept, ResponseStore
from gateway.protocols.responses import ResponsesExchange, input_messages
from gateway.recording.capture import Captured
from schemas import CallChoice

CALL = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"x": 1}'}}
TEXT_CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}], "prompt_token_ids": [1, 2]},
    {"choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
    {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 3}},
]
TOOL_CHUNKS = [
    {"choices": [{"index": 0, "delta": {"role": "assistant"}}], "prompt_token_ids": [1, 2]},
    {
        "choices": [
            {"index": 0, "delta": {"tool_calls": [{"index": 0, **CALL}]}, "finish_reason": "tool_calls"}
        ]
    },
]


def _chat(message: dict[str, Any], finish: str) -> dict[str, Any]:
    return {
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 3},
    }


def _events(raw: list[bytes]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for event in raw:
        head, data = event.decode().strip().split("\n")
        out.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def test_response_items_become_chat_messages() -> None:
    items: list[Any] = [
        {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"role": "user", "content": "add one to 1"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me."}]},
        {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"x": 1}', "id": "fc_1"},
        {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"x": 2}'},
        {"type": "reasoning", "summary": []},
        {"type": "function_call_output", "call_id": "c1", "output": "2"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "3"}]},
    ]
    assert input_messages(items) == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "add one to 1"},
        {
            "role": "assistant",
            "content": "Let me.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"x": 1}'}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"x": 2}'}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "2"},
        {"role": "tool", "tool_call_id": "c2", "content": "3"},
    ]
    with pytest.raises(InvalidRequestError) as info:
        input_messages([{"type": "computer_call_output"}])
    assert info.value.param == "input[0].type"


@pytest.mark.parametrize("chunks", [TEXT_CHUNKS, TOOL_CHUNKS], ids=["text", "tool"])
def test_responses_stream_is_what_the_openai_sdk_parses(chunks: list[dict[str, Any]]) -> None:
    from openai.types.responses import Response, ResponseStreamEvent

    x = ResponsesExchange(
        {"model": "p", "input": "hi", "stream": True}, EpisodeState("e" * 32), ResponseStore()
    )
    assert x.chat["messages"] == [{"role": "user", "content": "hi"}] and x.chat["stream"] is True
    stream = x.stream()
    raw = [e for c in chunks for e in stream.feed(c)]
    tool = chunks is TOOL_CHUNKS
    answer = x.answer(
        _chat(
            {
                "role": "assistant",
                "content": None if tool else "Hello",
                **({"tool_calls": [CALL]} if tool else {}),
            },
            "tool_calls" if tool else "stop",
        )
    )
    raw += stream.finish(answer)
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    events = [adapter.validate_python(data) for _, data in _events(raw)]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    final = Response.model_validate(answer)
    assert events[-1].response == final
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert done == final.output  # the streamed items are the answer's, ids included
    if tool:
        assert final.output[0].type == "function_call" and final.output[0].call_id == "call_1"
    else:
        assert final.output_text == "Hello"


@pytest.mark.parametrize("chunks", [TEXT_CHUNKS, TOOL_CHUNKS], ids=["text", "tool"])
def test_messages_stream_is_what_the_anthropic_sdk_parses(chunks: list[dict[str, Any]]) -> None:
    from anthropic.types import Message, RawMessageStreamEvent

    x = MessagesExchange({"model": "p", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    stream = x.stream()
    tool = chunks is TOOL_CHUNKS
    message = {
        "role": "assistant",
        "content": None if tool else "Hello",
        **({"tool_calls": [CALL]} if tool else {}),
    }
    answer = x.answer(_chat(message, "tool_calls" if tool else "stop"))
    raw = [e for c in chunks for e in stream.feed(c)] + stream.finish(answer)
    adapter: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
    named = _events(raw)
    assert all(name == data["type"] for name, data in named)
    events = [adapter.validate_python(data) for _, data in named]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    final = Message.model_validate(answer)
    assert final.stop_reason == ("tool_use" if tool else "end_turn")
    if tool:
        partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
        assert json.loads(partial) == final.content[0].input == {"x": 1}  # type: ignore[union-attr]
    else:
        assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == "Hello"


def test_messages_tool_results_come_before_the_users_text() -> None:
    x = MessagesExchange(
        {
            "max_tokens": 8,
            "system": [{"type": "text", "text": "sys"}],
            "messages": [
                {"role": "user", "content": "add one"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {"x": 1}}],
                },
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "here"},
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "2"}],
                        },
                    ],
                },
            ],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
            "stop_sequences": ["END"],
        }
    )
    assert x.chat["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "add one"},
        {"role": "assistant", "content": None, "tool_calls": [{**CALL, "id": "t1"}]},
        {"role": "tool", "tool_call_id": "t1", "content": "2"},
        {"role": "user", "content": "here"},
    ]
    assert (x.chat["tool_choice"], x.chat["parallel_tool_calls"], x.chat["stop"]) == (
        "required",
        False,
        ["END"],
    )


def test_response_store_is_bounded_per_episode_and_in_bytes() -> None:
    def kept(episode: str, size: int = 10) -> Kept:
        return Kept(episode, None, None, [], b"", None, None, size)

    store = ResponseStore(max_bytes=100, per_episode=2)
    for i in range(3):
        store.put(f"r{i}", kept("a"))
    assert store.get("r0") is None and store.get("r1") is not None and len(store) == 2
    for i in range(10):
        store.put(f"b{i}", kept(f"b{i}", 30))
    assert store.bytes <= 100 and store.get("b9") is not None and store.get("r1") is None
    with pytest.raises(NotFoundError):
        store.resolve("b9", EpisodeState("a"))  # another episode's response


def test_previous_response_id_hands_the_engine_the_recorded_ids() -> None:
    store = ResponseStore()
    episode = EpisodeState("e" * 32)
    first = ResponsesExchange({"input": "hi", "instructions": "sys"}, episode, store)
    answer = first.answer(_chat({"role": "assistant", "content": "Hello"}, "stop"))
    choice = CallChoice(index=0, token_ids=[7, 8], logprobs=[-0.1, -0.2])
    first.recorded(answer, Captured([1, 2, 3], [choice], {}))
    nxt = ResponsesExchange(
        {"input": "more", "instructions": "sys", "previous_response_id": first.id}, episode, store
    )
    assert nxt.chat["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "more"},
    ]
    assert nxt.prefix == {"messages": 3, "prompt_token_ids": [1, 2, 3], "response_token_ids": [7, 8]}
    other = ResponsesExchange(
        {"input": "more", "instructions": "new", "previous_response_id": first.id}, episode, store
    )
    assert other.prefix is None  # other instructions render another prompt: the ids cannot be reused
