"""Tokens-in: when a chat call extends the previous one exactly, the engine starts from recorded ids.

Agents resend their whole history as messages; the engine re-renders it with the chat template. When
the model's own reply does not survive that round trip (a tool call it wrote as ``{"a":6}`` comes
back from the tool parser as ``{"a": 6}`` and renders so), the new prompt's ids no longer start with
the previous prompt's and reply's, and the episode's calls stop merging into one trajectory.

After each token-faithful chat call the gateway keeps a :class:`Turn`: how many messages it had, a
digest of them, and a digest of each choice's reply message as the agent received it. When the next
call's messages are those same messages followed by one of those replies (content and tool calls
compared as sent back), the gateway adds ``prompt_prefix`` (the previous prompt's ids and that
choice's ids) to the request for the embedded engine, which then renders only what follows
(``infra.engine.serving.EngineServing._extended_prompt``).

vLLM (0.32 and later) takes a chat prompt's ids in ``kv_transfer_params.prompt_token_ids``: it skips
rendering and tokenising, and still parses tool calls and detokenises the reply. For a vLLM upstream
the gateway asks vLLM's ``/tokenize`` for the conversation's ids rendered twice (up to and including
the reply's turn, and whole with the generation prompt) and :func:`splice_ids` builds the same prompt
the embedded engine would: the previous prompt's ids, the reply's ids as sampled, then only what the
template adds after the reply's end-of-turn token. Anything else is rendered as before. The agent's
request as recorded is unchanged.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.upstream.client import Upstream


def _digest(value: Any) -> bytes:
    return hashlib.blake2b(orjson.dumps(value, option=orjson.OPT_SORT_KEYS), digest_size=16).digest()


def _reply_key(message: Any) -> bytes | None:
    """An assistant message as the engine sent it and as an agent sends it back: content and tool calls
    (id, name, argument string); fields agents add or drop on the way (``refusal``, ``annotations``,
    ``null`` vs absent) do not count."""
    if not isinstance(message, dict) or message.get("role", "assistant") != "assistant":
        return None
    calls = []
    for call in message.get("tool_calls") or []:
        if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
            return None
        fn = call["function"]
        calls.append((call.get("id"), fn.get("name"), fn.get("arguments")))
    try:
        return _digest([message.get("content") or "", calls])
    except TypeError:
        return None


@dataclass(frozen=True, slots=True)
class Turn:
    messages: int  # how many messages the call had
    history: bytes  # their digest
    replies: tuple[bytes | None, ...]  # per choice: its reply message's key
    finished: tuple[bool, ...] = ()  # per choice: the reply ended on its own (not cut by max_tokens)


def turn_of(data: dict[str, Any], response: dict[str, Any]) -> Turn | None:
    """What a recorded chat call leaves for the next one to extend; None when it cannot be extended."""
    messages = data.get("messages")
    choices = response.get("choices")
    if not isinstance(messages, list) or not isinstance(choices, list) or not choices:
        return None
    try:
        history = _digest(messages)
    except TypeError:
        return None
    ordered = sorted((c for c in choices if isinstance(c, dict)), key=lambda c: c.get("index", 0))
    return Turn(
        len(messages),
        history,
        tuple(_reply_key(c.get("message")) for c in ordered),
        tuple(c.get("finish_reason") != "length" for c in ordered),
    )


def prompt_prefix(
    data: dict[str, Any], turn: Turn | None, prompt: Sequence[int] | None, responses: Sequence[Sequence[int]]
) -> dict[str, Any] | None:
    """The ``prompt_prefix`` for this call, or None when it does not extend the previous call exactly."""
    messages = data.get("messages")
    if turn is None or prompt is None or not isinstance(messages, list) or len(messages) <= turn.messages + 1:
        return None
    key = _reply_key(messages[turn.messages])
    if key is None or key not in turn.replies:
        return None
    choice = turn.replies.index(key)
    if choice >= len(responses) or not responses[choice]:
        return None
    if choice < len(turn.finished) and not turn.finished[choice]:
        return None  # a reply cut by max_tokens has no end-of-turn token to continue after
    try:
        if _digest(messages[: turn.messages]) != turn.history:
            return None
    except TypeError:
        return None
    return {
        "messages": turn.messages + 1,
        "prompt_token_ids": list(prompt),
        "response_token_ids": list(responses[choice]),
    }


def splice_ids(prefix: dict[str, Any], turn_ids: Sequence[int], full_ids: Sequence[int]) -> list[int] | None:
    """The extending call's prompt from recorded ids, or None when the renderings do not vouch for it.

    ``turn_ids`` is the conversation rendered up to and including the reply's assistant turn (no
    generation prompt), ``full_ids`` the whole conversation with it; both by the engine's own template.
    The reply's last id must be the end-of-turn token the template closes that turn with (found among
    the turn's last few ids: ChatML adds a newline after it) and ``full_ids`` must start with
    ``turn_ids``. Then: the previous prompt's ids, the reply's ids, and what the template adds after
    the end-of-turn token.
    """
    reply = prefix["response_token_ids"]
    if not reply or list(full_ids[: len(turn_ids)]) != list(turn_ids):
        return None
    # the end-of-turn token among the turn's last ids (ChatML puts one newline after it)
    window = range(len(turn_ids) - 1, max(len(turn_ids) - 5, -1), -1)
    at = next((i for i in window if turn_ids[i] == reply[-1]), -1)
    if at < 0:
        return None
    return [*prefix["prompt_token_ids"], *reply, *turn_ids[at + 1 :], *full_ids[len(turn_ids) :]]


async def vllm_prompt_ids(
    upstream: Upstream, body: dict[str, Any], prefix: dict[str, Any]
) -> list[int] | None:
    """The prompt ids vLLM is to start this call from (tokens-in), or None to let it render as usual."""
    messages = body.get("messages")
    if (
        not isinstance(messages, list)
        or body.get("continue_final_message")
        or body.get("add_generation_prompt") is False
        or body.get("echo")
    ):
        return None
    common: dict[str, Any] = {
        key: body[key] for key in ("model", "tools", "chat_template", "chat_template_kwargs") if body.get(key)
    }
    k = prefix["messages"]
    turn, full = await asyncio.gather(
        upstream.tokenize_chat({**common, "messages": messages[:k], "add_generation_prompt": False}),
        upstream.tokenize_chat({**common, "messages": messages, "add_generation_prompt": True}),
    )
    if turn is None or full is None:
        return None
    return splice_ids(prefix, turn, full)
