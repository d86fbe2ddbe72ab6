"""``flywheel demo``'s options: clashes fail in one line (where the demo prints it), ``--tiny`` sizes."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from examples.demo import cli, pretrained, run
from examples.demo.options import (
    AgentChoice,
    DemoOptionError,
    DemoOptions,
    EngineChoice,
    ModelChoice,
    SourceChoice,
    TaskChoice,
    TenantsChoice,
)


def _app() -> typer.Typer:
    app = typer.Typer()
    cli.register(app)
    app.command("other")(lambda: None)  # a group, so the command is reached by name
    return app


def _defaults() -> dict[str, Any]:
    """``flywheel demo``'s own defaults, read from the command."""
    command = typer.main.get_group(_app()).commands["demo"]
    return {p.name: p.default for p in command.params if p.name}


def _options(tmp_path: Path, **changes: Any) -> DemoOptions:
    values = {**_defaults(), "cache": tmp_path, **changes}
    return DemoOptions(**{f.name: values[f.name] for f in fields(DemoOptions)})


def test_the_options_object_holds_every_option_of_the_command() -> None:
    assert set(_defaults()) == {f.name for f in fields(DemoOptions)}


@pytest.mark.parametrize(
    ("changes", "message", "on_console"),
    [
        (
            {"agent": AgentChoice.sql, "source": SourceChoice.production},
            "error: --agent sql runs with --source rollouts only, without --optimize-prompt",
            False,
        ),
        (
            {"optimize_prompt": True},
            "error: --optimize-prompt needs --reflection-url and --reflection-model",
            False,
        ),
        (
            {"source": SourceChoice.replay},
            "--source replay needs --from <a recorded `flywheel demo --out` directory>",
            True,
        ),
        ({"replay_from": Path("x")}, "--from is for --source replay only", True),
        (
            {"tenants": TenantsChoice.shared},
            "--tenants is for --source production, without --optimize-prompt or --baseline",
            True,
        ),
        (
            {"curriculum": 0.5, "source": SourceChoice.production},
            "--curriculum picks the tasks of requested rollouts: --source rollouts only",
            True,
        ),
        ({"feedback_delay": "0.5:0,0.5:60"}, "--feedback-delay is for --source production", True),
        (
            {"feedback_delay": "half:0", "source": SourceChoice.production},
            "error: --feedback-delay 'half:0': expected SHARE:SECONDS or SHARE:LOW-HIGH, comma-separated "
            "(e.g. 0.5:0,0.5:120-240)",
            False,
        ),
        (
            {"feedback_delay": "0.5:0,0.4:60-30", "source": SourceChoice.production},
            "error: --feedback-delay '0.5:0,0.4:60-30': shares must be >= 0 and add up to 1, and each LOW <= HIGH",
            False,
        ),
        (
            {"gates": True, "engine": EngineChoice.vllm},
            "--gates runs the calculator agent on the embedded engine, without --optimize-prompt",
            True,
        ),
        (
            {"algo": ("nope=1",)},
            "error: --algo 'nope=1': expected KEY=VALUE with KEY one of the trainer's algorithm knobs "
            "(docs/configuration.md, FLYWHEEL_TRAINER_ALGO__<KEY>)",
            False,
        ),
        (
            {"algo": ("kl_coef",)},
            "error: --algo 'kl_coef': expected KEY=VALUE with KEY one of the trainer's algorithm knobs "
            "(docs/configuration.md, FLYWHEEL_TRAINER_ALGO__<KEY>)",
            False,
        ),
        (
            {"algo": ("kl_coef=-1",)},
            "error: --algo 'kl_coef=-1': Input should be greater than or equal to 0",
            False,
        ),
        (
            {"algo": ("kl_coef=none",)},
            "error: --algo 'kl_coef=none': Input should be a valid number",
            False,
        ),
        ({"task": TaskChoice.bfcl}, "error: --task and --vllm are for --model smollm2", False),
        ({"vllm": "http://127.0.0.1:8000"}, "error: --task and --vllm are for --model smollm2", False),
        (
            {"model": ModelChoice.smollm2, "source": SourceChoice.production, "gates": True},
            "error: --model smollm2 trains the BFCL agent alone; drop --source, --gates",
            False,
        ),
        (
            {"model": ModelChoice.smollm2, "agent": AgentChoice.sql, "curriculum": 0.5},
            "error: --model smollm2 trains the BFCL agent alone; drop --agent, --curriculum",
            False,
        ),
        (
            {"model": ModelChoice.smollm2, "policies": "writer,rewriter"},
            "error: --model smollm2's BFCL agent has one role: --policies shared trains one LoRA adapter over "
            "SmolLM2 (without --policies, the whole model)",
            False,
        ),
        (
            {"algo": ("behaviour_weight=sometimes",)},
            "error: --algo 'behaviour_weight=sometimes': Input should be 'truncated', 'tapered' or "
            "'tapered_sequence'",
            False,
        ),
    ],
)
def test_clashing_options_fail_in_one_line(
    tmp_path: Path, changes: dict[str, Any], message: str, on_console: bool
) -> None:
    with pytest.raises(DemoOptionError) as caught:
        _options(tmp_path, **changes).resolve()
    assert str(caught.value) == message
    assert caught.value.on_console is on_console


def test_smollm2_trains_one_adapter_with_policies_shared(tmp_path: Path) -> None:
    """``--model smollm2 --policies shared``: one LoRA adapter over SmolLM2 at ten times the full
    fine-tune's rate unless --lr says otherwise (the live run: tests/vllm/test_demo_smollm2_live.py)."""
    full = _options(tmp_path, model=ModelChoice.smollm2).resolve().config(0)
    assert pretrained.adapter_options(full) is None and full.learning_rate == pretrained.LEARNING_RATE
    cfg = _options(tmp_path, model=ModelChoice.smollm2, policies=" shared").resolve().config(0)
    assert cfg.policies == "shared" and cfg.learning_rate == 10 * pretrained.LEARNING_RATE
    assert pretrained.adapter_options(cfg) == pretrained.LORA
    given = _options(tmp_path, model=ModelChoice.smollm2, policies="shared", lr=1e-3).resolve().config(0)
    lora = pretrained.adapter_options(given)
    assert lora is not None and lora.learning_rate == 1e-3 and lora.rank == pretrained.LORA.rank


def test_the_command_exits_2_with_the_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(_app(), ["demo", "--source", "replay", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "--source replay needs --from" in result.output


def test_algo_knobs_reach_the_trainer_and_a_replay_may_be_gated(tmp_path: Path) -> None:
    options = _options(
        tmp_path,
        source=SourceChoice.replay,
        replay_from=tmp_path,
        gates=True,
        algo=("behaviour_weight=truncated", "KL_COEF=0.2", "lr_decay_steps=none"),
    )
    cfg = options.resolve().config(1)
    assert cfg.algorithm == {"behaviour_weight": "truncated", "kl_coef": "0.2", "lr_decay_steps": None}
    assert cfg.gates and cfg.source == "replay"
    settings = run.stack_settings(cfg, tmp_path / "data", tmp_path / "trainer")
    # the replay's own choices (tapered_sequence, an annealed rate) give way to the command line's
    algo = settings.trainer.trainer_algo
    assert (algo.behaviour_weight, algo.kl_coef) == ("truncated", 0.2)
    # "none" unsets a knob that may be unset, even one the replay sets itself
    algo = run.stack_settings(
        replace(cfg, recorded_steps=40), tmp_path / "d", tmp_path / "t"
    ).trainer.trainer_algo
    assert algo.lr_decay_steps is None
    plain = _options(tmp_path, source=SourceChoice.replay, replay_from=tmp_path).resolve().config(1)
    plain = replace(plain, recorded_steps=461)  # the recorded run's (its report's rl_steps)
    algo = run.stack_settings(plain, tmp_path / "data", tmp_path / "trainer").trainer.trainer_algo
    assert (algo.behaviour_weight, algo.kl_coef, algo.reference_kl) == ("tapered_sequence", 0.0, True)
    assert algo.lr_decay_steps == 461  # a replay anneals over the recorded run's length
    short = run.stack_settings(replace(plain, max_steps=16), tmp_path / "d", tmp_path / "t")
    assert short.trainer.trainer_algo.lr_decay_steps == 16  # or over the steps it was given


def test_tiny_shrinks_the_run_and_the_agent_sets_the_rest(tmp_path: Path) -> None:
    plan = _options(tmp_path, tiny=True, batch_groups=8, users=64).resolve()
    assert (plan.batch_groups, plan.group_size, plan.eval_tasks, plan.users) == (2, 2, 4, 4)
    assert (plan.rl_seconds, plan.max_steps, plan.mistakes) == (20.0, 2, 0.25)
    cfg = _options(tmp_path, source=SourceChoice.rollouts).resolve().config(3)
    assert (cfg.seed, cfg.rl_seconds, cfg.eval_tasks, cfg.max_in_flight) == (3, 420.0, 512, 12)


def test_a_feedback_delay_draws_its_shares() -> None:
    import random

    from examples.demo.production import FeedbackDelay

    delay = FeedbackDelay.parse("0.5:0,0.5:120-240")
    draws = [delay.draw(random.Random(i)) for i in range(400)]
    at_once = sum(1 for d in draws if d == 0)
    assert 150 < at_once < 250 and all(d == 0 or 120 <= d <= 240 for d in draws)
    assert str(delay) == "0.5:0,0.5:120-240" and FeedbackDelay.parse("").draw(random.Random(0)) == 0
