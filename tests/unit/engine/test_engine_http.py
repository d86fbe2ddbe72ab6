from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import openai
import pytest

from infra.engine import InferenceEngine
from infra.engine.app import create_engine_app
from infra.engine.serving import EngineServing

pytestmark = pytest.mark.timeout(120)  # the first test also pays for importing torch + transformers

MESSAGES = [{"role": "system", "content": "You add."}, {"role": "user", "content": "What is 12+30?"}]
IDS = {"return_token_ids": True, "return_weight_versions": True}


@pytest.fixture
async def http(engine: InferenceEngine) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=create_engine_app(engine))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        yield client


@pytest.fixture
def client(http: httpx.AsyncClient) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://engine/v1", api_key="unused", http_client=http, max_retries=0)


async def test_chat_completion_shapes(client: openai.AsyncOpenAI, engine: InferenceEngine) -> None:
    resp = await client.chat.completions.create(
        model="policy",
        messages=MESSAGES,
        max_tokens=12,
        seed=4,
        n=2,
        logprobs=True,
        top_logprobs=3,
        extra_body=IDS,
    )
    body = resp.model_dump()
    expected_prompt = engine.tokenizer.apply_chat_template(
        MESSAGES, add_generation_prompt=True, return_dict=False
    )
    assert body["object"] == "chat.completion" and body["prompt_token_ids"] == list(expected_prompt)
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for choice in body["choices"]:
        ids = choice["token_ids"]
        assert 1 <= len(ids) <= 12 and choice["weight_versions"] == [0] * len(ids)
        content = choice["logprobs"]["content"]
        assert len(content) == len(ids) and all(len(e["top_logprobs"]) == 3 for e in content)
        assert all(e["logprob"] <= 0 for e in content)
        assert choice["message"]["role"] == "assistant"
        assert choice["finish_reason"] in ("stop", "length")
    assert body["usage"]["prompt_tokens"] == len(expected_prompt)
    assert body["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in body["choices"])


async def test_chat_stream_reassembles_to_the_non_stream_result(client: openai.AsyncOpenAI) -> None:
    args = {
        "model": "policy",
        "messages": MESSAGES,
        "max_tokens": 25,
        "seed": 11,
        "logprobs": True,
        "extra_body": IDS,
    }
    whole = (await client.chat.completions.create(**args)).model_dump()["choices"][0]
    stream = await client.chat.completions.create(**args, stream=True, stream_options={"include_usage": True})
    chunks = [c.model_dump() async for c in stream]
    assert chunks[0]["prompt_token_ids"] and all(
        "prompt_token_ids" not in c or c is chunks[0] for c in chunks
    )
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    text = "".join(c["delta"]["content"] or "" for c in choices)
    ids = [t for c in choices for t in (c.get("token_ids") or [])]
    lps = [e["logprob"] for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
    assert text == whole["message"]["content"]
    assert ids == whole["token_ids"]
    assert lps == pytest.approx([e["logprob"] for e in whole["logprobs"]["content"]], abs=1e-6)
    assert [v for c in choices for v in (c.get("weight_versions") or [])] == whole["weight_versions"]
    assert choices[-1]["finish_reason"] == whole["finish_reason"]
    assert chunks[-1]["usage"]["completion_tokens"] == len(ids)


async def test_completions_with_token_id_and_text_prompts(
    client: openai.AsyncOpenAI, engine: InferenceEngine
) -> None:
    prompt_ids = engine.tokenizer.encode("What is 3+4?")
    resp = await client.completions.create(
        model="policy",
        prompt=prompt_ids,
        max_tokens=6,
        logprobs=2,
        seed=1,
        n=2,
        extra_body={"return_token_ids": True, "add_special_tokens": False, "ignore_eos": True},
    )
    body = resp.model_dump()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    for c in body["choices"]:
        assert c["prompt_token_ids"] == prompt_ids and len(c["token_ids"]) == 6
        assert len(c["logprobs"]["token_logprobs"]) == 6 and len(c["logprobs"]["tokens"]) == 6
    batch = await client.completions.create(
        model="policy",
        prompt=["What is", "CALC:"],
        max_tokens=4,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    got = batch.model_dump()["choices"]
    assert [c["index"] for c in got] == [0, 1]
    assert got[0]["prompt_token_ids"] == engine.tokenizer.encode("What is")
    same = await client.completions.create(
        model="policy",
        prompt="What is",
        max_tokens=4,
        seed=5,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    by_ids = await client.completions.create(
        model="policy",
        prompt=engine.tokenizer.encode("What is"),
        max_tokens=4,
        seed=5,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    assert same.model_dump()["choices"][0]["token_ids"] == by_ids.model_dump()["choices"][0]["token_ids"]


async def test_completion_stream_reassembles(client: openai.AsyncOpenAI) -> None:
    args = {
        "model": "policy",
        "prompt": "What is 1+2?",
        "max_tokens": 20,
        "seed": 2,
        "stop": ["5"],
        "extra_body": {"return_token_ids": True},
    }
    whole = (await client.completions.create(**args)).model_dump()["choices"][0]
    chunks = [c.model_dump() async for c in await client.completions.create(**args, stream=True)]
    choices = [c["choices"][0] for c in chunks]
    assert "".join(c["text"] for c in choices) == whole["text"]
    assert [t for c in choices for t in (c.get("token_ids") or [])] == whole["token_ids"]
    assert choices[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert choices[-1]["finish_reason"] == whole["finish_reason"]


async def test_models_and_bad_requests(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient, engine: InferenceEngine
) -> None:
    models = await client.models.list()
    assert [m.id for m in models.data] == [engine.model_name]
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.chat.completions.create(model="policy", messages=MESSAGES, max_tokens=100_000)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        await client.chat.completions.create(
            model="policy", messages=MESSAGES, max_tokens=100_000, stream=True
        )
    with pytest.raises(openai.BadRequestError, match="messages"):
        await client.chat.completions.create(model="policy", messages=[])
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        await client.chat.completions.create(model="policy", messages=MESSAGES, presence_penalty=1.0)
    for body in (
        b"{not json",
        b'{"prompt": [1, "a"]}',
        b'{"prompt": "x", "n": 0}',
        b'{"prompt": [99999999]}',
    ):
        resp = await http.post("/v1/completions", content=body, headers={"content-type": "application/json"})
        assert resp.status_code == 400, body
        assert resp.json()["error"]["code"] == 400 and resp.json()["error"]["message"]


async def test_dev_endpoints_pause_resume_and_load_weights(
    http: httpx.AsyncClient, engine: InferenceEngine, tmp_path
) -> None:
    assert (await http.get("/health")).status_code == 200
    assert (await http.get("/is_paused")).json() == {"is_paused": False}
    assert (await http.post("/pause", params={"mode": "keep"})).status_code == 200
    assert (await http.get("/is_paused")).json() == {"is_paused": True}
    assert (await http.post("/pause", params={"mode": "bogus"})).status_code == 400
    assert (await http.post("/resume")).json()["status"] == "resumed"
    assert (await http.get("/version")).json()["weight_version"] == 0

    bad = await http.post("/load_weights", json={"path": str(tmp_path / "missing"), "version": 1})
    assert bad.status_code == 400 and "still serving weight version 0" in bad.json()["error"]["message"]
    engine.model.save_pretrained(tmp_path / "ckpt")
    ok = await http.post("/load_weights", json={"path": str(tmp_path / "ckpt"), "version": 4})
    assert ok.json() == {"status": "ok", "weight_version": 4}
    assert (await http.get("/version")).json()["weight_version"] == 4
    resp = await http.post(
        "/v1/completions", json={"prompt": "What", "max_tokens": 3, "return_weight_versions": True}
    )
    assert resp.json()["choices"][0]["weight_versions"] == [4] * len(
        resp.json()["choices"][0]["weight_versions"]
    )


async def test_admin_token_guards_dev_endpoints(engine: InferenceEngine) -> None:
    app = create_engine_app(engine, admin_token="s3cret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as http:
        assert (await http.post("/pause")).status_code == 401
        assert (await http.post("/resume", headers={"Authorization": "Bearer s3cret"})).status_code == 200


async def test_a_client_leaving_a_stream_cancels_its_request(engine: InferenceEngine) -> None:
    from infra.engine.protocol import ChatCompletionRequest

    serving = EngineServing(engine)
    req = ChatCompletionRequest(messages=MESSAGES, max_tokens=200, stream=True, ignore_eos=True)
    stream = await serving.chat(req)
    assert not isinstance(stream, dict)
    chunks = [await anext(stream) for _ in range(3)]
    assert all(c.startswith("data: ") for c in chunks)
    await stream.aclose()  # type: ignore[attr-defined]
    await engine.wait_until(lambda: engine.num_running == 0)
    follow_up = await serving.chat(ChatCompletionRequest(messages=MESSAGES, max_tokens=3, ignore_eos=True))
    assert isinstance(follow_up, dict) and follow_up["choices"][0]["finish_reason"] == "length"
