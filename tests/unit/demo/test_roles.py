"""``flywheel demo --agent sql --policies``: the policy map per configuration, what is refused and how, and
the figures the report takes from the bus (``examples/demo/roles.py``, ``ledger.py``, and the
evaluation's ``adapters_by_model`` in ``pipeline.py``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from examples.demo.agents import CALC
from examples.demo.ledger import Ledger, model_of
from examples.demo.pipeline import adapters_by_model
from examples.demo.roles import RolePoliciesError, role_policies, update_figures, with_adapters
from examples.demo.sql_demo import SqlDemo
from flywheel.cli.main import app
from flywheel.stack_settings import StackSettings
from infra.bus.memory import MemoryBus
from infra.policies import PolicyMap
from schemas import CONTROL, EPISODES, EpisodeScored, LLMCallRecorded
from schemas.control import StepMetrics, TrainerStepCompleted

pytestmark = pytest.mark.timeout(60)

SQL = SqlDemo(data_root=Path("/nonexistent"))  # the roles only: no data is generated


def test_an_adapter_per_role_selects_each_roles_calls_and_leaves_the_checker_on_the_base() -> None:
    roles = role_policies(SQL, "writer,rewriter")
    assert roles.config == "per-role" and roles.roles == ("writer", "rewriter")
    policies = PolicyMap.parse(roles.policy_map())  # what the gateway and the trainer read
    assert policies.names == ["writer", "rewriter"]
    for role, policy in (("writer", "writer"), ("rewriter", "rewriter"), ("checker", None)):
        assert policies.policy_for(role, None, {}) == policy
        assert roles.policy_of(role) == policy


def test_shared_is_one_adapter_for_every_trained_role() -> None:
    roles = role_policies(SQL, "shared")
    assert roles.config == "shared" and roles.policies == {"shared": {"models": ["writer", "rewriter"]}}
    policies = PolicyMap.parse(roles.policy_map())
    assert [policies.policy_for(m, None, {}) for m in ("writer", "rewriter", "checker")] == [
        "shared",
        "shared",
        None,
    ]


def test_the_stack_gets_the_map_everywhere_and_the_adapters_rate(tmp_path: Path) -> None:
    roles = role_policies(SQL, "shared")
    settings, lora = with_adapters(StackSettings(data_dir=tmp_path), roles, 2e-3)
    for part in (settings, settings.gateway, settings.reward, settings.trainer):
        assert json.loads(part.policies) == roles.policies  # gateway, reward service and trainer read it
    assert settings.trainer.trainer_lora.learning_rate == 2e-3 and lora["learning_rate"] == 2e-3
    assert lora["rank"] == settings.trainer.trainer_lora.rank


def test_a_role_left_out_is_served_by_the_base() -> None:
    roles = role_policies(SQL, " writer ")
    assert roles.policies == {"writer": {"models": ["writer"]}}
    assert roles.policy_of("rewriter") is None


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "reader",
            "unknown role 'reader' of the sql agent (its trained roles: writer, rewriter; or 'shared')",
        ),
        ("checker", "'checker' is a fixed role of the sql agent"),
        ("writer,shared", "--policies shared is one adapter for every role"),
        ("writer,writer", "names a role twice"),
        (" , ", "--policies names roles (writer, rewriter) or is 'shared'"),
    ],
)
def test_a_bad_value_is_refused_in_one_line_naming_the_roles(spec: str, message: str) -> None:
    with pytest.raises(RolePoliciesError, match=r"^--policies") as err:
        role_policies(SQL, spec)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_an_agent_without_roles_has_no_policies() -> None:
    with pytest.raises(RolePoliciesError, match=r"agent with roles \(--agent sql\); the calc agent has one"):
        role_policies(CALC, "writer,rewriter")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--policies", "writer,rewriter"],
            "error: --policies trains an adapter per role of an agent with roles (--agent sql); the calc "
            "agent has one role",
        ),
        (
            ["--agent", "sql", "--policies", "writer,critic"],
            "error: --policies: unknown role 'critic' of the sql agent (its trained roles: writer, "
            "rewriter; or 'shared')",
        ),
        (
            ["--agent", "sql", "--policies", "shared", "--baseline"],
            "error: --policies runs on the embedded engine, without --baseline",
        ),
        (
            ["--agent", "sql", "--policies", "shared", "--engine", "vllm"],
            "error: --policies runs on the embedded engine, without --baseline",
        ),
    ],
)
def test_the_command_line_refuses_in_one_line(args: list[str], line: str, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["demo", "--out", str(tmp_path), "--cache", str(tmp_path), *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == line
    assert not list(tmp_path.iterdir())  # refused before anything ran


def _call(ep: str, seq: int, model: str, adapter: str | None, version: int | None) -> LLMCallRecorded:
    return LLMCallRecorded(
        episode_id=ep,
        call_seq=seq,
        call_id=f"{ep}-{seq}",
        request="{}",
        model=model,
        adapter=adapter,
        adapter_version=version,
    )


def _step(adapter: str | None, version: int, seconds: float, size: float | None) -> TrainerStepCompleted:
    figures = {"step_seconds": seconds, "train_seconds": seconds / 2}
    if size is not None:
        figures["adapter_bytes"] = size
    return TrainerStepCompleted(
        adapter=adapter, step=version, version=version, metrics=StepMetrics.model_validate(figures)
    )


async def _settle(ledger: Ledger, calls: int, steps: int) -> None:
    for _ in range(200):
        seen_calls = sum(sum(c.values()) for c in ledger.calls.values())
        if seen_calls >= calls and sum(len(s) for s in ledger.steps.values()) >= steps:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the ledger did not see every event")


async def test_the_ledger_reports_each_roles_adapter_and_each_policys_updates(tmp_path: Path) -> None:
    roles = role_policies(SQL, "writer,rewriter")
    async with MemoryBus() as bus:
        ledger = Ledger(bus, by=model_of)
        await ledger.start()
        for call in (
            _call("e1", 0, "writer", "writer", 0),
            _call("e1", 1, "checker", None, None),
            _call("e1", 2, "rewriter", "rewriter", 0),
            _call("e2", 0, "writer", "writer", 1),
        ):
            await bus.publish(EPISODES, call)
        for step in (
            _step("writer", 1, 0.2, 1000),
            _step("rewriter", 1, 0.4, 1000),
            _step("writer", 2, 0.4, 1000),
        ):
            await bus.publish(CONTROL, step)
        await _settle(ledger, calls=4, steps=3)
        await ledger.stop()
    figures = update_figures(ledger, roles, tmp_path)
    assert figures["calls_by_adapter"] == {
        "checker": {"(base)": 1},
        "rewriter": {"rewriter": 1},
        "writer": {"writer": 2},
    }
    writer = figures["updates_by_policy"]["writer"]
    assert writer["updates"] == 2 and writer["versions"] == 2 and writer["adapter_bytes"] == 1000
    assert writer["seconds_per_update"] == {"mean": 0.3, "min": 0.2, "max": 0.4}
    assert writer["versions_served"] == {"distinct": 2, "first": 0, "last": 1}
    assert figures["updates_by_policy"]["rewriter"]["updates"] == 1


async def test_the_full_fine_tune_reports_its_updates_and_the_bytes_of_the_model(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"x" * 4096)
    async with MemoryBus() as bus:
        ledger = Ledger(bus, by=model_of)
        await ledger.start()
        await bus.publish(CONTROL, _step(None, 1, 0.5, None))
        await _settle(ledger, calls=0, steps=1)
        await ledger.stop()
    figures = update_figures(ledger, None, tmp_path)
    assert "calls_by_adapter" not in figures
    (policy,) = figures["updates_by_policy"].values()
    assert policy["updates"] == 1 and policy["adapter_bytes"] is None and policy["model_bytes"] == 4096


def test_an_evaluation_names_the_adapter_that_served_each_role() -> None:
    scored = [EpisodeScored(episode_id=e, group_id=e, num_calls=2) for e in ("e1", "e2")]
    models = {"e1": {0: "writer", 1: "checker"}, "e2": {0: "writer", 1: "checker"}}
    served = {"e1": {0: ("writer", 3), 1: (None, None)}, "e2": {0: ("writer", 4), 1: (None, None)}}
    assert adapters_by_model(scored, models, served) == {
        "checker": {"(base)": []},
        "writer": {"writer": [3, 4]},
    }
    # no adapter served anything (the full fine-tune): nothing to report
    assert adapters_by_model(scored, models, {}) is None
    assert json.dumps(adapters_by_model(scored, models, served))  # report.json takes it as it is
