"""The embedded stack's settings are composed per service (``StackSettings.gateway``, ``.worker``, ...,
each the service's own class read from the same ``FLYWHEEL_*`` variables), so a variable sets one thing.

A field two services define would be one variable for both. That is safe only when it means the same
thing to each: this lists every such field and checks it has one type and one default everywhere. A new
collision (as ``drain_timeout_s`` was: the gateway's weight-update drain and the worker's shutdown drain
under one variable) fails here until it is renamed or added, with its reason, to ``SHARED``."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from pydantic import BaseModel, SecretStr

from flywheel import stack_settings
from flywheel.stack import StackSettings
from flywheel.stack_settings import PARTS
from gateway.settings import GatewaySettings
from infra.eventlog.settings import EventLogSettings
from infra.otel.settings import OtelSettings
from infra.settings import FlywheelSettings
from reward_service.settings import RewardSettings
from rollout_worker.settings import WorkerSettings
from trainer.settings import TrainerSettings

pytestmark = pytest.mark.timeout(30)
SERVICES: list[type[BaseModel]] = [
    GatewaySettings,
    WorkerSettings,
    RewardSettings,
    TrainerSettings,
    EventLogSettings,
    OtelSettings,
]
SHARED = {
    "metrics_port": "where this process serves Prometheus (a worker's or a reward service's own process)",
    "gateway_url": "the gateway the worker's agents and the reward service's judge reach",
}


def test_a_field_two_services_define_means_the_same_to_both() -> None:
    base = set(FlywheelSettings.model_fields)
    for a, b in itertools.combinations(SERVICES, 2):
        for name in (set(a.model_fields) & set(b.model_fields)) - base:
            assert name in SHARED, f"{a.__name__} and {b.__name__} both define {name!r}: rename one"
            fa, fb = a.model_fields[name], b.model_fields[name]
            assert (fa.annotation, fa.default) == (fb.annotation, fb.default), name
    assert set(SHARED) == set(stack_settings.SHARED)  # the stack documents the same ones


def test_the_stack_carries_every_service_field() -> None:
    for service in SERVICES:
        carried = [name for name, part in PARTS.items() if issubclass(part, service)]
        assert carried, service.__name__
        fields = set(StackSettings.model_fields) | set(PARTS[carried[0]].model_fields)
        assert set(service.model_fields) <= fields, service.__name__


def _variables(model: type[BaseModel]) -> set[str]:
    return {f"FLYWHEEL_{name.upper()}" for name in model.model_fields}


def test_a_variable_sets_one_thing() -> None:
    """Every ``FLYWHEEL_*`` name is one field of one part (or of the stack itself), but for the shared
    base fields, which every part carries as the stack has them, and the documented ``SHARED`` ones."""
    base = _variables(FlywheelSettings)
    shared = {f"FLYWHEEL_{name.upper()}" for name in SHARED}
    own = _variables(StackSettings) - base - {f"FLYWHEEL_{name.upper()}" for name in PARTS}
    owners: dict[str, list[str]] = {name: ["stack"] for name in own}
    for part_name, part in PARTS.items():
        for variable in _variables(part) - base:
            owners.setdefault(variable, []).append(part_name)
    several = {v: where for v, where in owners.items() if len(where) > 1 and v not in shared}
    assert not several, f"one variable, several settings: {several}"
    assert {v for v, where in owners.items() if len(where) > 1} == shared
    # the parts' own names are no variables: only the fields inside them are
    assert not {f"FLYWHEEL_{name.upper()}" for name in PARTS} & set(owners)


def test_a_field_given_by_name_reaches_its_part_and_a_variable_its_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLYWHEEL_TRAINER_MAX_IN_FLIGHT", "7")
    monkeypatch.setenv("FLYWHEEL_CONCURRENCY", "3")
    monkeypatch.setenv("FLYWHEEL_GATEWAY", '{"gateway_port": 9}')  # not a variable: ignored
    settings = StackSettings(
        data_dir=tmp_path, trainer_batch_groups=2, gateway_url="http://gw", run_trainer=False
    )
    assert settings.trainer.trainer_batch_groups == 2 and settings.trainer.trainer_max_in_flight == 7
    assert settings.worker.concurrency == 3 and settings.run_trainer is False
    assert settings.worker.gateway_url == settings.reward.gateway_url == "http://gw"  # SHARED: both
    assert settings.gateway.gateway_port == 0  # the stack's default: a free port
    for name in PARTS:  # the shared fields are the stack's in every part
        assert getattr(settings, name).data_dir == tmp_path, name
    key = SecretStr("k" * 20)
    changed = settings.replace(episode_key=key, gateway_model_routes="m=embedded+http://x/v1")
    assert all(getattr(changed, name).episode_key == key for name in PARTS)
    assert changed.gateway.gateway_model_routes == "m=embedded+http://x/v1"
    assert settings.gateway.gateway_model_routes == ""  # a copy
    with pytest.raises(ValueError, match="no such setting: trainer_batch_group"):
        settings.replace(trainer_batch_group=3)
