"""A fake vLLM-compatible model server: instant, deterministic, configurable. The gateway's contract.

It speaks the subset of vLLM's OpenAI API that Flywheel relies on (docs/architecture.md, "Token-faithful capture"):
``return_token_ids`` (chat: top-level ``prompt_token_ids`` + ``choices[i].token_ids``; streamed: prompt
ids in the first chunk, id deltas per chunk; completions: ``choices[i].prompt_token_ids``), logprobs
(chat ``logprobs.content[]`` with ``top_logprobs``; completions ``tokens/token_logprobs/top_logprobs``),
``return_weight_versions``, ``n`` (a completions batch of prompts: ``n`` choices per prompt, index
``prompt_i * n + j``, each with its prompt's ids, as vLLM lays them out), ``tools`` (a call to the first tool until a tool result is in the
conversation), ``max_tokens`` (finish_reason ``length``), ``stop`` is ignored.

Tokenizer: one token per UTF-8 byte (ids 0–255) plus role markers; the chat template is append-only,
so an agent that resends the history gets prompts that extend the previous call exactly (as a real
engine would when the framework does not re-render differently).

    cfg = FakeUpstreamConfig(latency_s=0.0)
    app = create_fake_upstream(cfg)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://fake/v1/")
    cfg.fail_next = [429, 500]   # the next two requests fail with these statuses
    cfg.hang_next = 1            # the next request never answers (test timeouts)
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

if TYPE_CHECKING:
    from gateway.upstream.client import Upstream

ROLE_IDS = {"system": 256, "user": 257, "assistant": 258, "tool": 259, "developer": 260}
END_ID = 261
EOS_ID = 262


@dataclass
class FakeUpstreamConfig:
    reply: str = "The answer is 42."
    tool_arguments: str = '{"x": 1}'
    use_tools: bool = True  # call the first offered tool when no tool result is in the conversation
    latency_s: float = 0.0  # before answering (and between streamed chunks / 10)
    weight_version: int = 0
    fail_next: list[int] = field(default_factory=list)
    hang_next: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)
    keep_requests: bool = True
    model: str = "fake-model"
    # as vLLM: only these names are served (the first the base, the rest listed as its adapters), any
    # other is a 404 "The model `x` does not exist."; None: any name is served (as the embedded engine)
    served_names: list[str] | None = None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def _tool_calls_text(calls: Any) -> str:
    out = [
        {
            "name": (c.get("function") or {}).get("name", ""),
            "arguments": (c.get("function") or {}).get("arguments", ""),
        }
        for c in calls or []
        if isinstance(c, dict)
    ]
    return json.dumps(out, separators=(",", ":")) if out else ""


def render_message(msg: dict[str, Any]) -> list[int]:
    """The ids of one rendered message: role marker, content bytes (+ tool calls), END."""
    body = _text(msg.get("content")) + _tool_calls_text(msg.get("tool_calls"))
    return [ROLE_IDS.get(str(msg.get("role")), 257), *body.encode(), END_ID]


def render_prompt(messages: list[dict[str, Any]]) -> list[int]:
    ids: list[int] = []
    for m in messages:
        ids += render_message(m)
    return [*ids, ROLE_IDS["assistant"]]


def token_text(tid: int) -> str:
    return bytes([tid]).decode("utf-8", "replace") if tid < 256 else ""


def logprob_of(position: int, tid: int) -> float:
    return -round(0.05 + ((position * 31 + tid) % 17) / 20.0, 4)


def _chat_logprob_entry(pos: int, tid: int, k: int) -> dict[str, Any]:
    tok = token_text(tid)
    lp = logprob_of(pos, tid)
    tops = [{"token": tok, "logprob": lp, "bytes": list(tok.encode())}]
    for j in range(1, k):
        alt = (tid + j) % 256
        tops.append({"token": token_text(alt), "logprob": lp - j, "bytes": [alt]})
    return {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": tops[:k]}


def create_fake_upstream(cfg: FakeUpstreamConfig | None = None) -> FastAPI:
    cfg = cfg or FakeUpstreamConfig()
    app = FastAPI()
    app.state.config = cfg

    async def gate(body: dict[str, Any]) -> Response | None:
        if cfg.keep_requests:
            cfg.requests.append(body)
        if cfg.served_names is not None and body.get("model") not in cfg.served_names:
            message = f"The model `{body.get('model')}` does not exist."
            return JSONResponse({"error": {"message": message, "type": "NotFoundError", "code": 404}}, 404)
        if cfg.hang_next > 0:
            cfg.hang_next -= 1
            await asyncio.sleep(3600)
        if cfg.fail_next:
            status = cfg.fail_next.pop(0)
            return JSONResponse(
                {"error": {"message": f"injected {status}", "type": "fake", "code": status}}, status
            )
        if cfg.latency_s:
            await asyncio.sleep(cfg.latency_s)
        return None

    def plan(
        body: dict[str, Any], messages: list[dict[str, Any]] | None, n: int
    ) -> list[tuple[str, list[Any]]]:
        """Per choice: (text, tool_calls) the fake generates."""
        tools = body.get("tools") or []
        wants_tool = (
            messages is not None
            and cfg.use_tools
            and bool(tools)
            and body.get("tool_choice") != "none"
            and not any(m.get("role") == "tool" for m in messages)
        )
        out: list[tuple[str, list[Any]]] = []
        for i in range(n):
            if wants_tool:
                name = (tools[0].get("function") or {}).get("name", "tool")
                call = {
                    "id": f"call_{i}_{len(cfg.requests)}",
                    "type": "function",
                    "function": {"name": name, "arguments": cfg.tool_arguments},
                }
                out.append(("", [call]))
            else:
                out.append((cfg.reply + (f" #{i}" if i else ""), []))
        return out

    def gen_ids(text: str, calls: list[Any], limit: int | None) -> tuple[list[int], str]:
        ids = [*(text + _tool_calls_text(calls)).encode(), END_ID]
        if limit is not None and len(ids) > limit:
            return ids[:limit], "length"
        return ids, "tool_calls" if calls else "stop"

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        if cfg.served_names is None:
            return {"object": "list", "data": [{"id": cfg.model, "object": "model"}]}
        base, *adapters = cfg.served_names
        entries = [{"id": base, "object": "model", "parent": None}]
        entries += [{"id": name, "object": "model", "parent": base} for name in adapters]
        return {"object": "list", "data": entries}

    @app.exception_handler(Exception)
    async def _bad_request(_: Request, exc: Exception) -> JSONResponse:
        # a real engine answers odd-but-valid JSON with 400, never 500
        return JSONResponse({"error": {"message": f"bad request: {exc}", "type": "BadRequestError"}}, 400)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat(request: Request) -> Response | dict[str, Any]:
        body = json.loads(await request.body())
        if (early := await gate(body)) is not None:
            return early
        messages = body["messages"]
        prompt = render_prompt(messages)
        n = int(body.get("n") or 1)
        k = int(body.get("top_logprobs") or 0)
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        limit = int(limit) if limit is not None else None
        want_ids = bool(body.get("return_token_ids"))
        want_lp = bool(body.get("logprobs"))
        want_wv = bool(body.get("return_weight_versions"))
        plans = plan(body, messages, n)
        cid, created = f"chatcmpl-fake{len(cfg.requests)}", int(time.time())
        if body.get("stream"):
            return StreamingResponse(
                _chat_stream(cfg, cid, created, prompt, plans, limit, k, want_ids, want_lp, want_wv, body),
                media_type="text/event-stream",
            )
        choices = []
        total = 0
        for i, (text, calls) in enumerate(plans):
            ids, finish = gen_ids(text, calls, limit)
            total += len(ids)
            shown = bytes(t for t in ids if t < 256).decode("utf-8", "replace")
            msg: dict[str, Any] = {"role": "assistant", "content": None if calls else shown}
            if calls:
                msg["tool_calls"] = calls
            choice: dict[str, Any] = {"index": i, "message": msg, "finish_reason": finish, "logprobs": None}
            if want_lp:
                choice["logprobs"] = {"content": [_chat_logprob_entry(p, t, k) for p, t in enumerate(ids)]}
            if want_ids:
                choice["token_ids"] = ids
            if want_wv:
                choice["weight_versions"] = [cfg.weight_version] * len(ids)
            choices.append(choice)
        resp: dict[str, Any] = {
            "id": cid,
            "object": "chat.completion",
            "created": created,
            "model": body.get("model") or cfg.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": total,
                "total_tokens": len(prompt) + total,
            },
        }
        if want_ids:
            resp["prompt_token_ids"] = prompt
        return Response(orjson.dumps(resp), media_type="application/json")

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response | dict[str, Any]:
        body = json.loads(await request.body())
        if (early := await gate(body)) is not None:
            return early
        raw = body["prompt"]
        if isinstance(raw, list) and raw and all(isinstance(t, int) for t in raw):
            batch = [raw]
        elif isinstance(raw, list) and raw:
            batch = [p if isinstance(p, list) else [*_text(p).encode()] for p in raw]
        else:
            batch = [[*_text(raw if isinstance(raw, str) else "").encode()]]
        n = int(body.get("n") or 1)
        k = body.get("logprobs")
        limit = int(body["max_tokens"]) if body.get("max_tokens") is not None else None
        want_ids = bool(body.get("return_token_ids"))
        plans = plan(body, None, n)
        cid, created = f"cmpl-fake{len(cfg.requests)}", int(time.time())
        choice_data = []
        for pi in range(len(batch)):
            for i, (text, calls) in enumerate(plans):
                ids, finish = gen_ids(text + (f" ~{pi}" if pi else ""), calls, limit)
                choice_data.append((pi * n + i, ids, finish))
        if body.get("stream"):
            return StreamingResponse(
                _completion_stream(cfg, cid, created, batch, n, choice_data, k, want_ids, body),
                media_type="text/event-stream",
            )
        choices = []
        for i, ids, finish in choice_data:
            c: dict[str, Any] = {
                "index": i,
                "text": "".join(token_text(t) for t in ids),
                "finish_reason": finish,
                "logprobs": _completion_logprobs(ids, 0, k) if k is not None else None,
            }
            if want_ids:
                c["prompt_token_ids"] = batch[i // n]
                c["token_ids"] = ids
            choices.append(c)
        total = sum(len(ids) for _, ids, _ in choice_data)
        prompt_total = sum(len(p) for p in batch)
        resp = {
            "id": cid,
            "object": "text_completion",
            "created": created,
            "model": body.get("model") or cfg.model,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_total,
                "completion_tokens": total,
                "total_tokens": prompt_total + total,
            },
        }
        return Response(orjson.dumps(resp), media_type="application/json")

    return app


def _completion_logprobs(ids: list[int], start: int, k: int) -> dict[str, Any]:
    toks = [token_text(t) for t in ids]
    lps = [logprob_of(start + p, t) for p, t in enumerate(ids)]
    tops = (
        [
            {tok: lp, **{token_text((t + j) % 256) + f"~{j}": lp - j for j in range(1, k)}}
            for tok, lp, t in zip(toks, lps, ids, strict=True)
        ]
        if k
        else [{tok: lp} for tok, lp in zip(toks, lps, strict=True)]
    )
    return {
        "tokens": toks,
        "token_logprobs": lps,
        "top_logprobs": tops,
        "text_offset": list(range(start, start + len(ids))),
    }


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


async def _chat_stream(
    cfg: FakeUpstreamConfig,
    cid: str,
    created: int,
    prompt: list[int],
    plans: list[tuple[str, list[Any]]],
    limit: int | None,
    k: int,
    want_ids: bool,
    want_lp: bool,
    want_wv: bool,
    body: dict[str, Any],
) -> AsyncIterator[bytes]:
    model = body.get("model") or cfg.model
    head = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model}
    first: dict[str, Any] = {
        **head,
        "choices": [
            {
                "index": i,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
            for i in range(len(plans))
        ],
    }
    if want_ids:
        first["prompt_token_ids"] = prompt
    yield _sse(first)
    total = 0
    for i, (text, calls) in enumerate(plans):
        ids = [*(text + _tool_calls_text(calls)).encode(), END_ID]
        finish = "tool_calls" if calls else "stop"
        if limit is not None and len(ids) > limit:
            ids, finish = ids[:limit], "length"
        total += len(ids)
        # text in pieces of up to 4 tokens; a tool call as header + argument pieces
        pieces: list[tuple[list[int], dict[str, Any]]] = []
        if calls:
            fn = calls[0]["function"]
            head_len = len(_tool_calls_text(calls)) - len(fn["arguments"]) - 3
            split = max(0, min(head_len, len(ids)))
            pieces.append(
                (
                    ids[:split],
                    {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": calls[0]["id"],
                                "type": "function",
                                "function": {"name": fn["name"], "arguments": ""},
                            }
                        ]
                    },
                )
            )
            rest = ids[split:]
            args = fn["arguments"]
            for j in range(0, len(rest), 4):
                part = rest[j : j + 4]
                arg_piece = args[j : j + 4] if j < len(args) else ""
                pieces.append((part, {"tool_calls": [{"index": 0, "function": {"arguments": arg_piece}}]}))
            covered = min(len(args), ((len(rest) + 3) // 4) * 4)
            if len(args) > covered:
                pieces.append(([], {"tool_calls": [{"index": 0, "function": {"arguments": args[covered:]}}]}))
        else:
            for j in range(0, len(ids), 4):
                part = ids[j : j + 4]
                pieces.append((part, {"content": "".join(token_text(t) for t in part)}))
        pos = 0
        for part, delta in pieces:
            ch: dict[str, Any] = {"index": i, "delta": delta, "logprobs": None, "finish_reason": None}
            if want_lp:
                ch["logprobs"] = {"content": [_chat_logprob_entry(pos + p, t, k) for p, t in enumerate(part)]}
            if want_ids:
                ch["token_ids"] = part
            if want_wv:
                ch["weight_versions"] = [cfg.weight_version] * len(part)
            pos += len(part)
            yield _sse({**head, "choices": [ch]})
            if cfg.latency_s:
                await asyncio.sleep(cfg.latency_s / 10)
        yield _sse(
            {**head, "choices": [{"index": i, "delta": {}, "logprobs": None, "finish_reason": finish}]}
        )
    if (body.get("stream_options") or {}).get("include_usage"):
        yield _sse(
            {
                **head,
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": total,
                    "total_tokens": len(prompt) + total,
                },
            }
        )
    yield b"data: [DONE]\n\n"


async def _completion_stream(
    cfg: FakeUpstreamConfig,
    cid: str,
    created: int,
    batch: list[list[int]],
    n: int,
    choice_data: list[tuple[int, list[int], str]],
    k: int | None,
    want_ids: bool,
    body: dict[str, Any],
) -> AsyncIterator[bytes]:
    head = {
        "id": cid,
        "object": "text_completion",
        "created": created,
        "model": body.get("model") or cfg.model,
    }
    for i, ids, finish in choice_data:
        for j in range(0, len(ids), 4):
            part = ids[j : j + 4]
            c: dict[str, Any] = {
                "index": i,
                "text": "".join(token_text(t) for t in part),
                "finish_reason": None,
                "logprobs": _completion_logprobs(part, j, k) if k is not None else None,
            }
            if want_ids:
                c["token_ids"] = part
                if j == 0:
                    c["prompt_token_ids"] = batch[i // n]
            yield _sse({**head, "choices": [c]})
        yield _sse({**head, "choices": [{"index": i, "text": "", "finish_reason": finish, "logprobs": None}]})
    yield b"data: [DONE]\n\n"


def fake_upstream(cfg: FakeUpstreamConfig, *, timeout_s: float = 10.0) -> Upstream:
    """The fake as the gateway's upstream, in process (``http://fake/v1`` over an ASGI transport), as
    ``EmbeddedStack(upstream=...)`` takes it."""
    import httpx

    from gateway.upstream.client import make_upstream

    transport = httpx.ASGITransport(app=create_fake_upstream(cfg))
    return make_upstream("http://fake/v1", timeout_s=timeout_s, transport=transport)


class BackgroundUpstream:
    """The fake served by uvicorn on a loopback port from its own thread (for subprocess clients).

    with BackgroundUpstream(FakeUpstreamConfig()) as up:
        up.url  # "http://127.0.0.1:PORT/v1"
    """

    def __init__(self, cfg: FakeUpstreamConfig | None = None) -> None:
        import threading

        self.config = cfg or FakeUpstreamConfig()
        self.app = create_fake_upstream(self.config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-upstream", daemon=True)
        self._server: Any = None
        self.url = ""

    def __enter__(self) -> BackgroundUpstream:
        from gateway.server import GatewayServer

        self._thread.start()
        self._server = GatewayServer(self.app, port=0)
        root = asyncio.run_coroutine_threadsafe(self._server.start(), self._loop).result(30)
        self.url = f"{root}/v1"
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()
