"""One place maps an engine to the sink that loads weights into it (infra/application/assembly.py:
``choose_engine`` and ``RunningEngine.weight_sink``): ``flywheel trainer`` from its settings
(``trainer_engine``) and the embedded stack from the engine it started."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from infra.application.assembly import RunningEngine, choose_engine, trainer_engine
from trainer.settings import TrainerSettings
from trainer.vllm_sink import VllmSink
from trainer.weights import HttpSink

pytestmark = pytest.mark.timeout(30)


def test_each_engine_kind_gets_its_sink() -> None:
    assert isinstance(RunningEngine(choose_engine(vllm_url="http://127.0.0.1:8000")).weight_sink(), VllmSink)
    flywheel = RunningEngine(choose_engine(flywheel_url="http://127.0.0.1:8001/", token="t")).weight_sink()
    assert isinstance(flywheel, HttpSink) and flywheel.url == "http://127.0.0.1:8001"
    assert RunningEngine(choose_engine(upstream_url="http://127.0.0.1:8003/v1")).weight_sink() is None
    with pytest.raises(ValueError, match="not two"):
        choose_engine(vllm_url="http://127.0.0.1:8000", flywheel_url="http://127.0.0.1:8001")
    with pytest.raises(ValueError, match="flywheel or vllm, not 'sglang'"):
        trainer_engine(
            TrainerSettings(trainer_engine_url="http://127.0.0.1:8002").model_copy(
                update={"trainer_engine_kind": "sglang"}
            )
        )


def test_the_trainers_settings_choose_through_it() -> None:
    assert trainer_engine(TrainerSettings(trainer_engine_url="")) is None
    choice = trainer_engine(
        TrainerSettings(
            trainer_engine_url="http://127.0.0.1:8000",
            trainer_engine_kind="vllm",
            trainer_engine_token=SecretStr("k"),
        )
    )
    assert choice is not None and choice.token == "k"
    assert isinstance(RunningEngine(choice).weight_sink(), VllmSink)
    choice = trainer_engine(TrainerSettings(trainer_engine_url="http://127.0.0.1:8001"))
    assert choice is not None
    assert isinstance(RunningEngine(choice).weight_sink(), HttpSink)


async def test_a_policy_map_on_an_engine_adapters_cannot_reach_is_a_one_line_refusal(tmp_path: Path) -> None:
    from infra.application.alone import serve_trainer
    from infra.service import ServiceStartError

    settings = TrainerSettings(
        data_dir=tmp_path,
        trainer_base_model=tmp_path,  # refused before any model is loaded
        policies="writer,rewriter",
        trainer_engine_url="http://127.0.0.1:8000",
        trainer_engine_kind="vllm",
    )
    with pytest.raises(ServiceStartError, match="trainer: LoRA policies load into the embedded engine"):
        await serve_trainer(settings, max_steps=0)
