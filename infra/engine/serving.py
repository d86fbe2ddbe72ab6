"""Turn OpenAI/vLLM requests into engine calls and engine results into vLLM-shaped JSON.

No FastAPI here (app.py is the thin router), so this logic is testable without HTTP. Response shapes
follow vLLM: with ``return_token_ids`` chat responses carry top-level ``prompt_token_ids`` and
``choices[i].token_ids`` (streaming: prompt ids in the first chunk, ``token_ids`` deltas per chunk);
completions carry ``choices[i].prompt_token_ids`` and ``choices[i].token_ids`` (a batch of prompts:
``n`` choices per prompt, ``index = prompt_i * n + j``, each with its own prompt's ids; streaming: on
each choice's first chunk, as vLLM does). With
``return_weight_versions`` each choice carries ``weight_versions``, one per generated token (deltas
when streaming). Logprobs are the sampling distribution's (vLLM ``processed_logprobs``); ``-inf``
is reported as -9999.0 as vLLM does.

Tool calls: when a chat request lists ``tools`` (and ``tool_choice`` is not ``"none"``) and the serving
was created with ``tool_parser="hermes"`` (the default), an answer with ``<tool_call>{json}</tool_call>``
blocks (what the Qwen template asks for) is returned as ``message.tool_calls`` with
``finish_reason="tool_calls"`` — streaming too, as ``delta.tool_calls`` in the last chunk (tools.py).
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

from infra.engine.core import ChoiceResult, InferenceEngine, RequestUpdate
from infra.engine.protocol import ChatCompletionRequest, CompletionRequest, PromptPrefix
from infra.engine.sampling import InvalidRequestError, SamplingParams
from infra.engine.streaming import JSON, TextDelta, by_choice, chain, merge, prime, sse, usage
from infra.engine.tools import ToolCallStream, parse_tool_calls, wants_tool_parsing


def _lp(value: float) -> float:
    return value if math.isfinite(value) else -9999.0


class EngineServing:
    """The OpenAI-compatible endpoints' logic over one ``InferenceEngine``."""

    def __init__(self, engine: InferenceEngine, *, tool_parser: str | None = "hermes") -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.tool_parser = tool_parser
        self._token_text: dict[int, str] = {}
        self.prompts_from_ids = 0  # chat prompts started from a PromptPrefix's ids (tokens-in)

    # ------------------------------------------------------------------------------- prompts
    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        ids = [int(i) for i in self._render(req, req.messages, req.add_generation_prompt, tokenize=True)]
        prefix = req.prompt_prefix
        if prefix is None or req.continue_final_message or not req.add_generation_prompt:
            return ids
        head = [*prefix.prompt_token_ids, *prefix.response_token_ids]
        if ids[: len(head)] == head:  # the history re-rendered to the very ids: nothing to splice
            return ids
        spliced = self._extended_prompt(req, prefix)
        if spliced is None:
            return ids
        self.prompts_from_ids += 1
        return spliced

    def _render(
        self,
        req: ChatCompletionRequest,
        messages: list[dict[str, Any]],
        generation_prompt: bool,
        *,
        tokenize: bool,
    ) -> Any:
        kwargs = dict(req.chat_template_kwargs or {})
        try:
            return self.tokenizer.apply_chat_template(
                messages,
                tools=req.tools,
                add_generation_prompt=generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message,
                tokenize=tokenize,
                return_dict=False,
                **kwargs,
            )
        except Exception as exc:  # template errors are the caller's malformed messages
            raise InvalidRequestError(f"cannot apply the chat template to these messages: {exc}") from exc

    def _extended_prompt(self, req: ChatCompletionRequest, prefix: PromptPrefix) -> list[int] | None:
        """``prefix``'s ids, then only what the template adds after its assistant turn; None (render as
        usual) unless the template, rendered, shows the prefix to be exactly that prompt and that reply.

        The gateway vouches that ``messages[:k - 1]`` are the previous call's messages (whose prompt was
        ``prompt_token_ids``, itself perhaps extended this way) and ``messages[k - 1]`` its reply. Here:
        the reply must end with an end-of-turn token (a finished reply, not one cut by ``max_tokens``)
        and the whole conversation's rendered text must start with the prefix's, turn for turn. What
        follows the end-of-turn marker inside the rendered assistant turn (ChatML's newline) is
        tokenised with the rest. The reply's own text is never re-rendered: a tool call the model
        wrote in its own JSON style stays as it wrote it.
        """
        k = prefix.messages
        msgs = req.messages
        if k < 2 or k >= len(msgs) or msgs[k - 1].get("role") != "assistant":
            return None
        reply = prefix.response_token_ids
        if reply[-1] not in self.engine.eos_token_ids:
            return None
        before = str(self._render(req, msgs[: k - 1], True, tokenize=False))
        turn = str(self._render(req, msgs[:k], False, tokenize=False))
        full = str(self._render(req, msgs, True, tokenize=False))
        if not turn.startswith(before) or not full.startswith(turn):
            return None
        end = self.tokenizer.decode([reply[-1]], skip_special_tokens=False)
        at = turn.rfind(end, len(before))
        if not end or at < 0:
            return None
        rest = turn[at + len(end) :] + full[len(turn) :]
        return [*prefix.prompt_token_ids, *reply, *self._encode(rest)]

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def completion_prompt(self, prompt: str | list[int], add_special_tokens: bool) -> list[int]:
        if isinstance(prompt, str):
            return [int(i) for i in self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)]
        return prompt

    # --------------------------------------------------------------------------- formatting
    def token_text(self, token_id: int, as_id: bool = False) -> str:
        if as_id:
            return f"token_id:{token_id}"
        text = self._token_text.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            self._token_text[token_id] = text
        return text

    def _chat_logprob_entries(
        self,
        token_ids: Sequence[int],
        lps: Sequence[float],
        tops: Sequence[Sequence[tuple[int, float]]],
        as_id: bool,
    ) -> list[JSON]:
        entries = []
        for tid, lp, top in zip(token_ids, lps, tops, strict=True):
            text = self.token_text(tid, as_id)
            entries.append(
                {
                    "token": text,
                    "logprob": _lp(lp),
                    "bytes": list(text.encode("utf-8")),
                    "top_logprobs": [
                        {
                            "token": (t := self.token_text(alt, as_id)),
                            "logprob": _lp(alt_lp),
                            "bytes": list(t.encode("utf-8")),
                        }
                        for alt, alt_lp in top
                    ],
                }
            )
        return entries

    def _completion_logprobs(self, choice: ChoiceResult, as_id: bool, offset: int = 0) -> JSON:
        tokens = [self.token_text(t, as_id) for t in choice.token_ids]
        offsets, pos = [], offset
        for t in tokens:
            offsets.append(pos)
            pos += len(t)
        top = []
        for tid, lp, alts in zip(choice.token_ids, choice.logprobs, choice.top_logprobs, strict=True):
            entry = {self.token_text(a, as_id): _lp(alp) for a, alp in alts}
            entry.setdefault(self.token_text(tid, as_id), _lp(lp))
            top.append(entry)
        return {
            "text_offset": offsets,
            "token_logprobs": [_lp(x) for x in choice.logprobs],
            "tokens": tokens,
            "top_logprobs": top,
        }

    def _parses_tools(self, req: ChatCompletionRequest) -> bool:
        return self.tool_parser == "hermes" and wants_tool_parsing(req.tools, req.tool_choice)

    # --------------------------------------------------------------------------------- chat
    async def chat(self, req: ChatCompletionRequest) -> JSON | AsyncIterator[str]:
        params = req.to_sampling_params()
        prompt = self.chat_prompt(req)
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        model = req.model or self.engine.model_name
        if req.stream:
            stream = self.engine.generate(
                prompt, params, request_id=request_id, adapter=self.engine.adapter_for(req.model)
            )
            first = await prime(stream)
            return self._chat_stream(req, params, prompt, request_id, model, first, stream)
        result = await self.engine.complete(
            prompt, params, request_id=request_id, adapter=self.engine.adapter_for(req.model)
        )
        as_id = req.return_tokens_as_token_ids
        choices = []
        for c in result.choices:
            content: str | None = c.text
            tool_calls: list[JSON] = []
            finish: str = c.finish_reason
            if self._parses_tools(req) and c.finish_reason == "stop":
                content, tool_calls = parse_tool_calls(c.text)
                if tool_calls:
                    finish = "tool_calls"
            choice: JSON = {
                "index": c.index,
                "message": {
                    "role": "assistant",
                    "content": content,
                    "tool_calls": tool_calls,
                    "reasoning_content": None,
                },
                "logprobs": {
                    "content": self._chat_logprob_entries(c.token_ids, c.logprobs, c.top_logprobs, as_id)
                }
                if params.logprobs is not None
                else None,
                "finish_reason": finish,
                "stop_reason": c.stop_reason,
            }
            if req.return_token_ids:
                choice["token_ids"] = c.token_ids
            if req.return_weight_versions:
                choice["weight_versions"] = c.weight_versions
            choices.append(choice)
        completion_tokens = sum(len(c.token_ids) for c in result.choices)
        body: JSON = {
            "id": request_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": usage(len(prompt), completion_tokens),
            "prompt_logprobs": None,
            "prompt_token_ids": prompt if req.return_token_ids else None,
        }
        return body

    async def _chat_stream(
        self,
        req: ChatCompletionRequest,
        params: SamplingParams,
        prompt: list[int],
        request_id: str,
        model: str,
        first: RequestUpdate | None,
        stream: AsyncGenerator[RequestUpdate, None],
    ) -> AsyncIterator[str]:
        try:
            created = int(time.time())
            base = {"id": request_id, "object": "chat.completion.chunk", "created": created, "model": model}
            deltas = {i: TextDelta(self.tokenizer, params) for i in range(params.n)}
            parse = self._parses_tools(req)
            calls = {i: ToolCallStream() for i in range(params.n)} if parse else {}
            completion_tokens = 0
            for i in range(params.n):
                chunk: JSON = {
                    **base,
                    "choices": [
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    ],
                }
                if req.return_token_ids and i == 0:
                    chunk["prompt_token_ids"] = prompt
                yield sse(chunk)
            async for update in chain(first, stream):
                for index, tokens, done in by_choice(update):
                    completion_tokens += len(tokens)
                    text = deltas[index].push([t.token_id for t in tokens], done)
                    delta: JSON = {"content": text}
                    finish: str | None = done.finish_reason if done else None
                    if parse:
                        delta["content"] = calls[index].push(text)
                        if done is not None:
                            rest, tool_calls = calls[index].finish(done.text, done.finish_reason == "stop")
                            delta["content"] += rest
                            if tool_calls:
                                delta["tool_calls"] = tool_calls
                                finish = "tool_calls"
                    choice: JSON = {
                        "index": index,
                        "delta": delta,
                        "logprobs": {
                            "content": self._chat_logprob_entries(
                                [t.token_id for t in tokens],
                                [t.logprob for t in tokens],
                                [t.top_logprobs for t in tokens],
                                req.return_tokens_as_token_ids,
                            )
                        }
                        if params.logprobs is not None
                        else None,
                        "finish_reason": finish,
                    }
                    if done:
                        choice["stop_reason"] = done.stop_reason
                    if req.return_token_ids:
                        choice["token_ids"] = [t.token_id for t in tokens]
                    if req.return_weight_versions:
                        choice["weight_versions"] = [t.weight_version for t in tokens]
                    yield sse({**base, "choices": [choice]})
            if req.include_usage:
                yield sse({**base, "choices": [], "usage": usage(len(prompt), completion_tokens)})
            yield sse("[DONE]")
        finally:
            # a client that goes away mid-stream must not leave its request decoding
            await stream.aclose()

    # -------------------------------------------------------------------------- completions
    async def completions(self, req: CompletionRequest) -> JSON | AsyncIterator[str]:
        params = req.to_sampling_params()
        prompts = [self.completion_prompt(p, req.add_special_tokens) for p in req.prompts()]
        for p in prompts:
            self.engine.check_prompt(p, params)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        model = req.model or self.engine.model_name
        if req.stream:
            streams = [
                self.engine.generate(
                    p, params, request_id=f"{request_id}-{i}", adapter=self.engine.adapter_for(req.model)
                )
                for i, p in enumerate(prompts)
            ]
            return self._completion_stream(req, params, prompts, request_id, model, streams)
        adapter = self.engine.adapter_for(req.model)
        results = await asyncio.gather(*(self.engine.complete(p, params, adapter=adapter) for p in prompts))
        choices = []
        for pi, result in enumerate(results):
            for c in result.choices:
                choice: JSON = {
                    "index": pi * params.n + c.index,
                    "text": c.text,
                    "logprobs": self._completion_logprobs(c, req.return_tokens_as_token_ids)
                    if params.logprobs is not None
                    else None,
                    "finish_reason": c.finish_reason,
                    "stop_reason": c.stop_reason,
                    "prompt_logprobs": None,
                }
                if req.return_token_ids:
                    choice["prompt_token_ids"] = result.prompt_token_ids
                    choice["token_ids"] = c.token_ids
                if req.return_weight_versions:
                    choice["weight_versions"] = c.weight_versions
                choices.append(choice)
        totals = usage(
            sum(len(p) for p in prompts), sum(len(c.token_ids) for r in results for c in r.choices)
        )
        return {
            "id": request_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": choices,
            "usage": totals,
        }

    async def _completion_stream(
        self,
        req: CompletionRequest,
        params: SamplingParams,
        prompts: list[list[int]],
        request_id: str,
        model: str,
        streams: Sequence[AsyncIterator[RequestUpdate]],
    ) -> AsyncIterator[str]:
        base = {"id": request_id, "object": "text_completion", "created": int(time.time()), "model": model}
        deltas = {
            (pi, i): TextDelta(self.tokenizer, params) for pi in range(len(prompts)) for i in range(params.n)
        }
        sent_prompt: set[int] = set()  # choice indices whose prompt ids went out (vLLM: once per choice)
        completion_tokens = 0
        async for pi, update in merge(streams):
            for index, tokens, done in by_choice(update):
                completion_tokens += len(tokens)
                ids = [t.token_id for t in tokens]
                text = deltas[(pi, index)].push(ids, done)
                i = pi * params.n + index
                choice: JSON = {
                    "index": i,
                    "text": text,
                    "logprobs": None,
                    "finish_reason": done.finish_reason if done else None,
                    "stop_reason": done.stop_reason if done else None,
                }
                if params.logprobs is not None:
                    partial = ChoiceResult(
                        index,
                        ids,
                        [t.logprob for t in tokens],
                        [t.top_logprobs for t in tokens],
                        [],
                        "",
                        "stop",
                        None,
                    )
                    choice["logprobs"] = self._completion_logprobs(partial, req.return_tokens_as_token_ids)
                if req.return_token_ids:
                    if i not in sent_prompt:
                        choice["prompt_token_ids"] = prompts[pi]
                        sent_prompt.add(i)
                    choice["token_ids"] = ids
                if req.return_weight_versions:
                    choice["weight_versions"] = [t.weight_version for t in tokens]
                yield sse({**base, "choices": [choice]})
        if req.include_usage:
            yield sse(
                {**base, "choices": [], "usage": usage(sum(len(p) for p in prompts), completion_tokens)}
            )
        yield sse("[DONE]")
