"""One place maps an engine to the sink that loads weights into it (flywheel/assembly.py:
``choose_engine`` and ``RunningEngine.weight_sink``): ``flywheel trainer`` from its settings
(``trainer_engine``) and the embedded stack from the engine it started."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from flywheel.assembly import RunningEngine, choose_engine, trainer_engine
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


def test_each_policys_adapter_loads_into_vllm_through_its_own_sink() -> None:
    from trainer.vllm_sink import VllmAdapterSink

    sinks = RunningEngine(choose_engine(vllm_url="http://127.0.0.1:8000/", token="k")).adapter_sinks()
    [writer], [rewriter] = sinks("writer"), sinks("rewriter")
    assert isinstance(writer, VllmAdapterSink) and isinstance(rewriter, VllmAdapterSink)
    assert (writer.adapter, rewriter.adapter) == ("writer", "rewriter")
    assert writer.url == "http://127.0.0.1:8000" and writer.loads_untrained
    with pytest.raises(ValueError, match="embedded engine, flywheel engine or vLLM"):
        RunningEngine(choose_engine(upstream_url="http://127.0.0.1:8003/v1")).adapter_sinks()


async def test_a_policy_map_on_a_vllm_that_does_not_answer_is_a_one_line_error(tmp_path: Path) -> None:
    """The trainer loads each untrained adapter into vLLM when it starts (vLLM answers an adapter's name
    only once loaded); a server that cannot take it stops the start with one line naming the adapter."""
    import socket

    from flywheel.alone import serve_trainer
    from infra.service import ServiceStartError
    from trainer.models.tiny import build_tiny

    model = build_tiny(
        tmp_path / "m", ["What is 1 plus 2? 3."], vocab_size=300, hidden=32, layers=1, heads=2, kv_heads=1
    )
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = TrainerSettings(
        data_dir=tmp_path,
        trainer_base_model=model,
        trainer_torch_threads=1,
        policies="writer,rewriter",
        trainer_engine_url=f"http://127.0.0.1:{port}",
        trainer_engine_kind="vllm",
    )
    with pytest.raises(
        ServiceStartError,
        match=r"trainer: sink vllm:http://127.0.0.1:\d+:writer could not load version 0: ConnectError",
    ):
        await serve_trainer(settings, max_steps=0)


def test_vllm_started_for_adapters_loads_them_at_runtime_and_mixes_them_in_a_batch() -> None:
    from infra.engine.vllm_server import VllmLaunch

    launch = VllmLaunch(model=Path("/models/policy"), device="cpu", enable_lora=True, max_lora_rank=32)
    command = launch.command()
    assert "--enable-lora" in command and command[command.index("--max-lora-rank") + 1] == "32"
    assert command[command.index("--max-loras") + 1] == "4"
    assert launch.environment({})["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = VllmLaunch(model=Path("/models/policy"), device="cpu")
    assert (
        "--enable-lora" not in plain.command()
        and "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in plain.environment({})
    )


def test_up_with_engine_vllm_and_a_policy_map_starts_vllm_for_runtime_adapters(tmp_path: Path) -> None:
    """``flywheel up --engine vllm`` with ``FLYWHEEL_POLICIES``: the launch it starts vLLM with."""
    from flywheel.cli.ops_up import vllm_launch
    from flywheel.stack import StackSettings
    from trainer.config import LoraOptions

    lora = StackSettings(data_dir=tmp_path, policies="writer,rewriter", trainer_lora=LoraOptions(rank=32))
    launch = vllm_launch(tmp_path, lora, 8123)
    command = launch.command()
    assert "--enable-lora" in command and command[command.index("--max-lora-rank") + 1] == "32"
    assert command[command.index("--served-model-name") + 1] == lora.model
    assert launch.environment({})["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    plain = vllm_launch(tmp_path, StackSettings(data_dir=tmp_path), 8123)
    assert "--enable-lora" not in plain.command()
