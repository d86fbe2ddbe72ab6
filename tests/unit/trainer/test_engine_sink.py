"""One place maps an engine to the sink that loads weights into it (trainer/app.py::engine_sink):
``flywheel trainer`` from its settings and the embedded stack from the engine it started."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from trainer.app import engine_sink, sinks_from_settings
from trainer.settings import TrainerSettings
from trainer.vllm_sink import VllmSink
from trainer.weights import HttpSink

pytestmark = pytest.mark.timeout(30)


def test_each_engine_kind_gets_its_sink() -> None:
    assert isinstance(engine_sink("vllm", "http://127.0.0.1:8000"), VllmSink)
    flywheel = engine_sink("flywheel", "http://127.0.0.1:8001/", token="t")
    assert isinstance(flywheel, HttpSink) and flywheel.url == "http://127.0.0.1:8001"
    with pytest.raises(ValueError, match="flywheel or vllm, not 'sglang'"):
        engine_sink("sglang", "http://127.0.0.1:8002")  # type: ignore[arg-type]


def test_the_trainers_settings_choose_through_it() -> None:
    assert sinks_from_settings(TrainerSettings(trainer_engine_url="")) == []
    (sink,) = sinks_from_settings(
        TrainerSettings(
            trainer_engine_url="http://127.0.0.1:8000",
            trainer_engine_kind="vllm",
            trainer_engine_token=SecretStr("k"),
        )
    )
    assert isinstance(sink, VllmSink)
    (sink,) = sinks_from_settings(TrainerSettings(trainer_engine_url="http://127.0.0.1:8001"))
    assert isinstance(sink, HttpSink)
