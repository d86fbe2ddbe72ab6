"""A trivial callable agent with a lean HTTP client: ``examples.agents_for_tests.lean_agent:run``.

The same conversation as ``callable_agent.run_pooled`` (``calls`` chat calls, default 3, in one growing
conversation), but each call is one HTTP/1.1 request written by hand over a pooled keep-alive
connection (asyncio streams, stdlib ``json``): no SDK, no httpx. A benchmark of many such agents measures
what serves them (the gateway, the worker), not an SDK's per-call cost. Imports nothing of Flywheel;
``llm`` is anything with ``base_url``, ``api_key`` and ``model`` attributes.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlsplit


class HTTPError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300]!r}")
        self.status = status


_Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]
# (event loop id, host, port) → idle keep-alive connections. Agents in one process share them.
_IDLE: dict[tuple[int, str, int], list[_Conn]] = {}


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "content-length" in headers:
        return await reader.readexactly(int(headers["content-length"]))
    if headers.get("transfer-encoding", "").lower() == "chunked":
        parts: list[bytes] = []
        while size := int((await reader.readline()).split(b";")[0], 16):
            parts.append(await reader.readexactly(size))
            await reader.readline()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):  # trailers
            pass
        return b"".join(parts)
    return await reader.read()  # close-delimited


async def post_json(url: str, payload: Any, api_key: str, timeout_s: float = 30.0) -> Any:
    """POST ``payload`` as JSON and return the decoded JSON answer (plain ``http://`` only)."""
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None:
        raise ValueError(f"lean client speaks plain http only: {url}")
    host, port = parts.hostname, parts.port or 80
    key = (id(asyncio.get_running_loop()), host, port)
    idle = _IDLE.setdefault(key, [])
    body = json.dumps(payload).encode()
    request = (
        f"POST {parts.path or '/'} HTTP/1.1\r\nHost: {host}:{port}\r\nAuthorization: Bearer {api_key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    for attempt in range(2):  # a pooled connection the server closed meanwhile gets one fresh retry
        reused = bool(idle)
        reader, writer = idle.pop() if idle else await asyncio.open_connection(host, port)
        try:
            async with asyncio.timeout(timeout_s):
                writer.write(request)
                status_line = await reader.readline()
                if not status_line:
                    raise ConnectionResetError("connection closed before the answer")
                headers: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                data = await _read_body(reader, headers)
        except (ConnectionError, asyncio.IncompleteReadError):
            writer.close()
            if reused and attempt == 0:
                continue
            raise
        except BaseException:
            writer.close()
            raise
        if headers.get("connection", "").lower() == "close":
            writer.close()
        else:
            idle.append((reader, writer))
        status = int(status_line.split()[1])
        if status >= 400:
            raise HTTPError(status, data)
        return json.loads(data)
    raise AssertionError("unreachable")


async def run(task: dict[str, Any], llm: Any) -> dict[str, Any]:
    spec = task.get("input") or {}
    messages: list[dict[str, str]] = [
        {"role": "user", "content": str(spec.get("question", "What is 6 times 7?"))}
    ]
    url = llm.base_url.rstrip("/") + "/chat/completions"
    reply = ""
    for turn in range(int(spec.get("calls", 3))):
        answer = await post_json(
            url, {"model": llm.model, "messages": messages, "max_tokens": 32}, llm.api_key
        )
        reply = answer["choices"][0]["message"]["content"] or ""
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": f"Check step {turn + 1}."})
    result: dict[str, Any] = {"output": reply}
    if "reward" in spec:
        result["reward"] = spec["reward"]
    return result
