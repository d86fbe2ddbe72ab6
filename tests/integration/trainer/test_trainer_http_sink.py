"""The HTTP weight sink against the real engine app (``POST /load_weights``), and the trainer run alone
(``flywheel.alone.serve_trainer``) wired from its settings."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from flywheel.alone import serve_trainer
from trainer.app import load_backend
from trainer.batching import sft_samples
from trainer.config import AlgorithmConfig
from trainer.settings import TrainerSettings
from trainer.weights import HttpSink, InProcessSink, WeightLoadError, WeightUpdate


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.models.tiny import build_tiny

    corpus = [f"What is {a}+{b}? CALC: {a}+{b} = {a + b}" for a in range(10) for b in range(10)]
    return build_tiny(
        tmp_path_factory.mktemp("tiny"), corpus, vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1
    )


@pytest.mark.timeout(90)
async def test_http_sink_loads_an_exported_checkpoint_into_the_engine(
    model_dir: Path, tmp_path: Path
) -> None:
    from infra.engine import InferenceEngine
    from infra.engine.app import create_engine_app

    backend = load_backend(model_dir, AlgorithmConfig(sft_learning_rate=1e-2))
    backend.sft_step(sft_samples([([1, 2, 3], [4, 5, 6])]))
    engine = InferenceEngine.from_pretrained(model_dir, max_model_len=64)
    app = create_engine_app(engine, admin_token="engine-secret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine") as client:
        sink = HttpSink("http://engine", client=client, token="engine-secret")
        path = backend.export_weights(tmp_path / "v1")
        await sink.load(WeightUpdate(1, backend.state_dict, path))
        assert engine.weight_version == 1
        served = engine.model.state_dict()
        for name, tensor in backend.model.state_dict().items():
            assert torch.equal(served[name], tensor), name
        with pytest.raises(WeightLoadError, match="HTTP 400"):
            await sink.load(WeightUpdate(2, backend.state_dict, tmp_path / "missing.safetensors"))
        with pytest.raises(WeightLoadError, match="HTTP 401"):
            await HttpSink("http://engine", client=client).load(WeightUpdate(2, backend.state_dict, path))
        assert engine.weight_version == 1  # failed loads leave the old version serving
        # the in-process sink hands the engine the full state dict (tied names included)
        backend.sft_step(sft_samples([([1, 2, 3], [4, 5, 6])]))
        await InProcessSink(engine.load_weights).load(WeightUpdate(backend.version, backend.state_dict))
        assert engine.weight_version == 2
        assert torch.equal(
            engine.model.state_dict()["lm_head.weight"], backend.model.state_dict()["lm_head.weight"]
        )
    await engine.close()


@pytest.mark.timeout(60)
async def test_serve_wires_a_trainer_from_settings(model_dir: Path, tmp_path: Path) -> None:
    settings = TrainerSettings(data_dir=tmp_path, trainer_base_model=model_dir, trainer_expected_gateways=0)
    await serve_trainer(settings, max_steps=0)
    with pytest.raises(SystemExit):
        await serve_trainer(TrainerSettings(data_dir=tmp_path), max_steps=0)


@pytest.mark.timeout(30)
async def test_http_sink_keeps_one_client_for_every_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """A client per update rebuilt an SSL context (15-35 ms of the trainer's loop) every time."""
    from trainer import weights

    loads: list[dict[str, object]] = []

    def engine(request: httpx.Request) -> httpx.Response:
        loads.append(json.loads(request.content))
        return httpx.Response(200, json={"version": loads[-1]["version"]})

    made: list[httpx.AsyncClient] = []
    real_client = httpx.AsyncClient

    def client(**kwargs: object) -> httpx.AsyncClient:
        made.append(real_client(transport=httpx.MockTransport(engine), **kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(weights.httpx, "AsyncClient", client)
    sink = HttpSink("http://engine")
    for version in (1, 2, 3):
        await sink.load(WeightUpdate(version, dict, Path(f"/exports/v{version}")))
    assert [body["version"] for body in loads] == [1, 2, 3]
    assert len(made) == 1 and not made[0].is_closed
    await sink.aclose()
    assert made[0].is_closed


@pytest.mark.timeout(30)
async def test_http_sink_resends_a_load_whose_connection_was_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept connection the engine's server closed as the update went out (ReadError before any
    response, seen in a SQL demo run) costs one resend, not a failed update; a connection dropped under
    the request twice fails the load; an engine that refuses is not retried."""
    from trainer import weights

    drops: list[int] = [1]  # how many requests in a row the "server" drops
    seen: list[int] = []
    limits: list[object] = []

    def engine(request: httpx.Request) -> httpx.Response:
        version = json.loads(request.content)["version"]
        seen.append(version)
        if drops[0] > 0:
            drops[0] -= 1
            raise httpx.ReadError("connection closed by the server", request=request)
        if version == 9:
            return httpx.Response(400, json={"error": {"message": "no such checkpoint"}})
        return httpx.Response(200, json={"version": version})

    real_client = httpx.AsyncClient

    def client(**kwargs: object) -> httpx.AsyncClient:
        limits.append(kwargs.get("limits"))
        return real_client(transport=httpx.MockTransport(engine), **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(weights.httpx, "AsyncClient", client)
    sink = HttpSink("http://engine")
    await sink.load(WeightUpdate(1, dict, Path("/exports/v1")))
    assert seen == [1, 1]
    drops[0] = 2
    with pytest.raises(WeightLoadError, match="ReadError"):
        await sink.load(WeightUpdate(2, dict, Path("/exports/v2")))
    assert seen == [1, 1, 2, 2]
    with pytest.raises(WeightLoadError, match="HTTP 400"):
        await sink.load(WeightUpdate(9, dict, Path("/exports/v9")))
    assert seen == [1, 1, 2, 2, 9]
    # idle connections are dropped before uvicorn's 5 s keep-alive closes them under a request
    [made] = limits
    assert isinstance(made, httpx.Limits) and made.keepalive_expiry is not None and made.keepalive_expiry < 5
    await sink.aclose()
