"""Issue 21, finding 4: limits at the door, answered in OpenAI's error format before any work.

Deep JSON (254+ levels: orjson's encoder limit, which gave a 500) on chat and completions, training
and production routes; oversized arrays; oversized and too many headers; a 9 MB chunked body to
``/v1/feedback`` (was 400); protocol errors uvicorn answers itself (were plain text).
"""

from __future__ import annotations

import socket

import httpx
import openai
import pytest

from gateway.limits import MAX_HEADER_BYTES, MAX_HEADERS, MAX_JSON_DEPTH, MAX_JSON_ITEMS
from tests.fakes.gateway_harness import ADMIN, BackgroundGateway

MSGS = [{"role": "user", "content": "hi"}]
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def gw(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    with BackgroundGateway(tmp_path_factory.mktemp("gw"), episode_wait_s=0.01, pause_hold_s=0.05) as g:
        yield g


def _err(r: httpx.Response, status: int, code: str | None = None) -> dict:  # type: ignore[type-arg]
    assert r.status_code == status, (r.status_code, r.text[:300])
    assert r.headers["content-type"].startswith("application/json"), r.headers
    error = r.json()["error"]
    assert set(error) >= {"message", "type", "param", "code"}, error
    if code is not None:
        assert error["code"] == code, error
    return error  # type: ignore[no-any-return]


def _nested(depth: int) -> object:
    node: object = "deep"
    for _ in range(depth):
        node = {"a": node}
    return node


@pytest.mark.parametrize("depth", [254, 300, 1000])
def test_deep_json_is_a_400_on_every_call_route(gw: BackgroundGateway, depth: int) -> None:
    _, key = gw.h.keystore.create(f"deep-{depth}")
    url = gw.episode_url(gw.open_episode())
    deep = '{"a":' * depth + "1" + "}" * depth
    chat = ('{"messages":[{"role":"user","content":"hi"}],"extra":' + deep + "}").encode()
    completion = ('{"prompt":"hi","extra":' + deep + "}").encode()
    with httpx.Client(timeout=10) as c:
        for base, headers in ((url, {}), (f"{gw.url}/v1", {"Authorization": f"Bearer {key}"})):
            for path, body in (("chat/completions", chat), ("completions", completion)):
                r = c.post(
                    f"{base}/{path}", content=body, headers={**headers, "Content-Type": "application/json"}
                )
                _err(r, 400, "json_too_deep")


def test_deep_json_through_the_openai_sdk(gw: BackgroundGateway) -> None:
    with openai.OpenAI(base_url=gw.episode_url(gw.open_episode()), api_key="x", max_retries=0) as client:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="policy", messages=MSGS, extra_body={"x": _nested(300)})  # type: ignore[arg-type]
        assert info.value.code == "json_too_deep"
        # at the limit it still works
        answer = client.chat.completions.create(
            model="policy",
            messages=MSGS,
            extra_body={"x": _nested(MAX_JSON_DEPTH - 3)},  # type: ignore[arg-type]
        )
    assert answer.choices


def test_deep_json_on_other_routes(gw: BackgroundGateway) -> None:
    _, key = gw.h.keystore.create("deep-other")
    ep = gw.open_episode()
    deep = '{"a":' * 300 + "1" + "}" * 300
    with httpx.Client(timeout=10) as c:
        _err(
            c.post(
                f"{gw.url}/episodes/{ep}/reward",
                content=('{"value": 1, "x": ' + deep + "}").encode(),
                headers={"Content-Type": "application/json"},
            ),
            400,
            "json_too_deep",
        )
        _err(
            c.post(
                f"{gw.url}/admin/episodes/{ep}/finish",
                content=('{"output": ' + deep + "}").encode(),
                headers={"Content-Type": "application/json", **ADMIN},
            ),
            400,
            "json_too_deep",
        )
        _err(
            c.post(
                f"{gw.url}/v1/feedback",
                content=("[" * 2000 + "]" * 2000).encode(),
                headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
            ),
            400,
            "json_too_deep",
        )


def test_huge_array_is_a_413(gw: BackgroundGateway) -> None:
    url = gw.episode_url(gw.open_episode())
    body = b'{"prompt": [' + b",".join([b"1"] * (MAX_JSON_ITEMS + 1)) + b"]}"
    with httpx.Client(timeout=10) as c:
        _err(c.post(f"{url}/completions", content=body), 413, "json_too_large")


def test_chunked_9mb_feedback_is_a_413(gw: BackgroundGateway) -> None:
    _, key = gw.h.keystore.create("chunked")
    chunk = b"x" * (1024 * 1024)
    with httpx.Client(timeout=30) as c:
        r = c.post(
            f"{gw.url}/v1/feedback",
            content=iter([chunk] * 9),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
    _err(r, 413, "body_too_large")


def test_oversized_and_too_many_headers_are_a_431(gw: BackgroundGateway) -> None:
    with httpx.Client(timeout=10) as c:
        _err(c.get(f"{gw.url}/healthz", headers={"x-big": "a" * 200_000}), 431, "headers_too_large")
        _err(c.get(f"{gw.url}/healthz", headers={"x-big": "a" * (MAX_HEADER_BYTES + 1)}), 431)
        many = {f"x-h{i}": "1" for i in range(2000)}
        _err(c.get(f"{gw.url}/healthz", headers=many), 431, "headers_too_large")
        _err(c.get(f"{gw.url}/healthz", headers={f"x-h{i}": "1" for i in range(MAX_HEADERS + 1)}), 431)
        assert c.get(f"{gw.url}/healthz", headers={f"x-h{i}": "1" for i in range(50)}).status_code == 200


def _raw(gw: BackgroundGateway, request: bytes) -> tuple[int, dict[str, str], bytes]:
    host, port = gw.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Bad\x01: y\r\n\r\n",
        b"POST /v1/feedback HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        b"NOT A REQUEST\r\n\r\n",
    ],
    ids=["bad-header-bytes", "length-and-chunked", "bad-request-line"],
)
def test_protocol_errors_are_openai_json(gw: BackgroundGateway, request_bytes: bytes) -> None:
    status, headers, body = _raw(gw, request_bytes)
    assert status == 400 and headers["content-type"] == "application/json", (status, headers, body)
    error = httpx.Response(400, content=body).json()["error"]
    assert error["code"] == "invalid_http" and error["type"] == "invalid_request_error"
