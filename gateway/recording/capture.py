"""Token-faithful capture: what the gateway reads from a response, and strips again (what it adds to
the request: ``gateway/recording/prepare.py``).

Pure functions and small accumulators over vLLM's OpenAI-compatible JSON (docs/architecture.md, "Token-faithful capture"):
- chat: ``prompt_token_ids`` top-level, ``choices[i].token_ids``, ``choices[i].logprobs.content[]``;
  streamed: prompt ids in the first chunk, ``token_ids`` deltas per chunk.
- completions: ``choices[i].prompt_token_ids`` / ``token_ids``, ``logprobs.tokens/token_logprobs``.
- ``choices[i].weight_versions`` when ``return_weight_versions`` was asked.
The agent receives an ordinary OpenAI response: whatever it did not ask for is removed; the recorded
event keeps everything.

Batched prompts (``/v1/completions`` with ``prompt`` a list of strings or of token-id lists): vLLM and
the embedded engine answer ``n`` choices per prompt, choice ``index = prompt_i * n + j``, each carrying
its own prompt's ``prompt_token_ids`` (streamed: on the choice's first chunk). Each choice is recorded
with its own prompt ids (``CallChoice.prompt_token_ids``; the call's ``prompt_token_ids`` is None). A
call whose choices cannot be matched to its prompts — a choice count other than prompts × n, an index
outside that layout, a choice without prompt ids, two choices of one prompt with different ids, or ids
that differ from a token-id prompt as sent — is recorded with no prompt ids outside its raw response and
``token_faithful=False``, so no transition is ever built on another prompt's ids.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.recording.prepare import SINGLE, Asked, Endpoint, PromptLayout, ints
from schemas import CallChoice, TokenLogprob


def _token_id(token: Any) -> int | None:
    if isinstance(token, str) and token.startswith("token_id:"):
        try:
            return int(token[9:])
        except ValueError:
            return None
    return None


def _spans(value: Any) -> list[int] | None:
    """vLLM ≥ 0.33's ``weight_versions``: ``[{"version": "7", "start": 0, "end": 16}, ...]`` (half-open
    ranges of output tokens, vllm/outputs.py ``WeightVersionSpan``) as one integer version per token."""
    if not isinstance(value, list) or not value:
        return None
    out: list[int] = []
    for span in value:
        if not isinstance(span, dict):
            return None
        try:
            version, start, end = int(span["version"]), int(span["start"]), int(span["end"])
        except (KeyError, TypeError, ValueError):
            return None  # a label that is not Flywheel's integer version: not recorded, never guessed
        if start != len(out) or end < start:
            return None
        out.extend([version] * (end - start))
    return out


@dataclass(slots=True)
class _ChoiceAcc:
    """One choice assembled from a response or from stream deltas."""

    index: int
    text: list[str] = field(default_factory=list)
    role: str = "assistant"
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None
    logprobs: list[float] = field(default_factory=list)
    top: list[list[TokenLogprob]] = field(default_factory=list)
    has_logprobs: bool = False
    weight_versions: list[int] | None = None
    chat_logprob_entries: list[Any] = field(default_factory=list)
    completion_logprobs: dict[str, list[Any]] = field(default_factory=dict)
    extra_message: dict[str, Any] = field(default_factory=dict)

    def add_ids(self, ids: Any) -> None:
        got = ints(ids)
        if got is not None:
            self.token_ids = (self.token_ids or []) + got

    def add_versions(self, versions: Any) -> None:
        got = ints(versions)
        if got is None:
            got = _spans(versions)
        if got is not None:
            self.weight_versions = (self.weight_versions or []) + got

    def add_chat_logprobs(self, lp: Any) -> None:
        if not isinstance(lp, dict) or not isinstance(lp.get("content"), list):
            return
        self.has_logprobs = True
        for entry in lp["content"]:
            if not isinstance(entry, dict):
                continue
            self.chat_logprob_entries.append(entry)
            self.logprobs.append(float(entry.get("logprob", 0.0)))
            self.top.append(
                [
                    TokenLogprob(
                        token_id=_token_id(t.get("token")),
                        token=str(t.get("token", "")),
                        logprob=max(float(t.get("logprob", 0.0)), -1e30),
                    )
                    for t in entry.get("top_logprobs") or []
                    if isinstance(t, dict)
                ]
            )

    def add_completion_logprobs(self, lp: Any) -> None:
        if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
            return
        self.has_logprobs = True
        for key in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
            if isinstance(lp.get(key), list):
                self.completion_logprobs.setdefault(key, []).extend(lp[key])
        self.logprobs.extend(float(v) if v is not None else 0.0 for v in lp["token_logprobs"])
        for alts in lp.get("top_logprobs") or []:
            self.top.append(
                [
                    TokenLogprob(token_id=_token_id(tok), token=str(tok), logprob=max(float(v), -1e30))
                    for tok, v in (alts or {}).items()
                    if v is not None
                ]
            )

    def add_tool_call_delta(self, delta: Any) -> None:
        if not isinstance(delta, dict):
            return
        idx = delta.get("index", len(self.tool_calls))
        call = self.tool_calls.setdefault(
            idx, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        if delta.get("type"):
            call["type"] = delta["type"]
        fn = delta.get("function") or {}
        if fn.get("name"):
            call["function"]["name"] += fn["name"]
        if fn.get("arguments"):
            call["function"]["arguments"] += fn["arguments"]

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": self.role, "content": "".join(self.text) if self.text else None}
        if self.tool_calls:
            msg["tool_calls"] = [self.tool_calls[k] for k in sorted(self.tool_calls)]
        msg.update(self.extra_message)
        return msg

    def to_choice(self, endpoint: Endpoint, prompt_token_ids: list[int] | None = None) -> CallChoice:
        faithful = self.token_ids is not None and self.has_logprobs
        return CallChoice(
            index=self.index,
            text="".join(self.text),
            message=self.message() if endpoint == "chat.completions" else None,
            finish_reason=self.finish_reason,
            token_ids=self.token_ids,
            logprobs=self.logprobs if faithful else (self.logprobs or None),
            top_logprobs=self.top if any(self.top) else None,
            weight_versions=self.weight_versions,
            prompt_token_ids=prompt_token_ids,
        )


@dataclass(slots=True)
class Captured:
    prompt_token_ids: list[int] | None  # the single prompt's ids (None for a batched call)
    choices: list[CallChoice]  # a batched call's choices carry their own prompt's ids
    response: dict[str, Any]  # the full response (assembled when streamed), ids included
    layout: PromptLayout = SINGLE
    matched: bool = True  # every choice's prompt ids are known and consistent with the layout

    @property
    def token_faithful(self) -> bool:
        if not self.matched or not self.choices:
            return False
        if self.layout.batched:
            prompts_known = all(c.prompt_token_ids is not None for c in self.choices)
        else:
            prompts_known = self.prompt_token_ids is not None
        return prompts_known and all(
            c.token_ids is not None and c.logprobs is not None and len(c.logprobs) == len(c.token_ids)
            for c in self.choices
        )


def _resolve(
    accs: list[_ChoiceAcc],
    top: list[int] | None,
    layout: PromptLayout,
    endpoint: Endpoint,
    response: dict[str, Any],
) -> Captured:
    """Match each choice to its prompt's ids (module docstring); unmatched calls keep no prompt ids."""
    accs = sorted(accs, key=lambda a: a.index)
    if not layout.batched:
        prompt = top
        if prompt is None:
            prompt = next((a.prompt_token_ids for a in accs if a.prompt_token_ids is not None), None)
        sent = layout.ids[0] if layout.ids else None
        matched = all(a.prompt_token_ids in (None, prompt) for a in accs) and (
            sent is None or prompt is None or prompt == sent
        )
        choices = [a.to_choice(endpoint) for a in accs]
        return Captured(prompt if matched else None, choices, response, layout, matched)
    n = layout.n
    groups: dict[int, list[int]] = {}
    matched = [a.index for a in accs] == list(range(layout.prompts * n))
    for a in accs if matched else ():
        p, ids = a.index // n, a.prompt_token_ids
        sent = layout.ids[p] if p < len(layout.ids) else None
        if ids is None or groups.setdefault(p, ids) != ids or (sent is not None and ids != sent):
            matched = False
            break
    choices = [a.to_choice(endpoint, groups[a.index // n] if matched else None) for a in accs]
    return Captured(None, choices, response, layout, matched)


def capture_response(data: dict[str, Any], endpoint: Endpoint, layout: PromptLayout = SINGLE) -> Captured:
    """Read ids, logprobs and text from a complete (non-streamed) response."""
    accs: list[_ChoiceAcc] = []
    prompt = ints(data.get("prompt_token_ids"))
    for raw in data.get("choices") or []:
        if not isinstance(raw, dict):
            continue
        acc = _ChoiceAcc(index=int(raw.get("index", len(accs))))
        acc.finish_reason = raw.get("finish_reason")
        acc.add_ids(raw.get("token_ids"))
        acc.add_versions(raw.get("weight_versions"))
        if endpoint == "chat.completions":
            msg = raw.get("message") or {}
            acc.role = str(msg.get("role") or "assistant")
            if isinstance(msg.get("content"), str):
                acc.text.append(msg["content"])
            for i, call in enumerate(msg.get("tool_calls") or []):
                if isinstance(call, dict):
                    acc.tool_calls[i] = call
            acc.extra_message = {
                k: v for k, v in msg.items() if k not in ("role", "content", "tool_calls") and v is not None
            }
            acc.add_chat_logprobs(raw.get("logprobs"))
        else:
            acc.text.append(str(raw.get("text") or ""))
            acc.add_completion_logprobs(raw.get("logprobs"))
            acc.prompt_token_ids = ints(raw.get("prompt_token_ids"))
        accs.append(acc)
    return _resolve(accs, prompt, layout, endpoint, data)


def strip_response(data: dict[str, Any], endpoint: Endpoint, asked: Asked) -> None:
    """Remove (in place) what the gateway added and the client did not ask for."""
    if not asked.token_ids:
        data.pop("prompt_token_ids", None)
    for choice in data.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        if not asked.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not asked.weight_versions:
            choice.pop("weight_versions", None)
        if not asked.logprobs and "logprobs" in choice:
            choice["logprobs"] = None


class StreamAssembler:
    """Accumulates SSE chunks into the response the stream amounts to."""

    def __init__(self, endpoint: Endpoint, layout: PromptLayout = SINGLE) -> None:
        self.endpoint = endpoint
        self.layout = layout
        self.prompt_token_ids: list[int] | None = None
        self.choices: dict[int, _ChoiceAcc] = {}
        self.head: dict[str, Any] = {}
        self.usage: Any = None

    def feed(self, chunk: dict[str, Any]) -> None:
        if not self.head:
            self.head = {k: chunk.get(k) for k in ("id", "created", "model", "system_fingerprint")}
        if self.prompt_token_ids is None:
            self.prompt_token_ids = ints(chunk.get("prompt_token_ids"))
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for raw in chunk.get("choices") or []:
            if not isinstance(raw, dict):
                continue
            idx = int(raw.get("index", 0))
            acc = self.choices.get(idx)
            if acc is None:
                acc = self.choices[idx] = _ChoiceAcc(index=idx)
            if raw.get("finish_reason") is not None:
                acc.finish_reason = raw["finish_reason"]
            acc.add_ids(raw.get("token_ids"))
            acc.add_versions(raw.get("weight_versions"))
            if self.endpoint == "chat.completions":
                delta = raw.get("delta") or {}
                if delta.get("role"):
                    acc.role = delta["role"]
                if isinstance(delta.get("content"), str):
                    acc.text.append(delta["content"])
                for call in delta.get("tool_calls") or []:
                    acc.add_tool_call_delta(call)
                acc.add_chat_logprobs(raw.get("logprobs"))
            else:
                if isinstance(raw.get("text"), str):
                    acc.text.append(raw["text"])
                if acc.prompt_token_ids is None:  # vLLM: on each choice's first chunk
                    acc.prompt_token_ids = ints(raw.get("prompt_token_ids"))
                acc.add_completion_logprobs(raw.get("logprobs"))

    @staticmethod
    def is_final(chunk: dict[str, Any]) -> bool:
        """A chunk that ends a choice (or the usage chunk): held back until the call is recorded."""
        choices = chunk.get("choices")
        if not choices:
            return True
        return any(isinstance(c, dict) and c.get("finish_reason") is not None for c in choices)

    def result(self) -> Captured:
        accs = [self.choices[k] for k in sorted(self.choices)]
        if self.endpoint == "chat.completions":
            body_choices: list[dict[str, Any]] = [
                {
                    "index": a.index,
                    "message": a.message(),
                    "logprobs": {"content": a.chat_logprob_entries} if a.has_logprobs else None,
                    "finish_reason": a.finish_reason,
                    "token_ids": a.token_ids,
                }
                for a in accs
            ]
            obj = "chat.completion"
        else:
            body_choices = [
                {
                    "index": a.index,
                    "text": "".join(a.text),
                    "logprobs": a.completion_logprobs if a.has_logprobs else None,
                    "finish_reason": a.finish_reason,
                    "token_ids": a.token_ids,
                }
                for a in accs
            ]
            obj = "text_completion"
        for a, c in zip(accs, body_choices, strict=True):
            if a.weight_versions is not None:
                c["weight_versions"] = a.weight_versions
            if a.prompt_token_ids is not None:
                c["prompt_token_ids"] = a.prompt_token_ids
        response: dict[str, Any] = {**self.head, "object": obj, "choices": body_choices}
        if self.prompt_token_ids is not None:
            response["prompt_token_ids"] = self.prompt_token_ids
        if self.usage is not None:
            response["usage"] = self.usage
        return _resolve(accs, self.prompt_token_ids, self.layout, self.endpoint, response)


def count_tokens(captured: Captured) -> tuple[int, int]:
    """(prompt tokens, completion tokens) from ids, else from the reported usage."""
    usage = captured.response.get("usage") or {}
    if captured.prompt_token_ids is not None:
        prompt = len(captured.prompt_token_ids)
    elif captured.layout.batched and captured.token_faithful:  # each prompt once, not once per choice
        n = captured.layout.n
        prompt = sum(len(c.prompt_token_ids or []) for c in captured.choices if c.index % n == 0)
    else:
        prompt = int(usage.get("prompt_tokens") or 0)
    if all(c.token_ids is not None for c in captured.choices) and captured.choices:
        completion = sum(len(c.token_ids or []) for c in captured.choices)
    else:
        completion = int(usage.get("completion_tokens") or 0)
    return prompt, completion
