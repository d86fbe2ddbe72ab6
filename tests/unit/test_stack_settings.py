"""The embedded stack's settings inherit every service's (one flat ``FLYWHEEL_*`` namespace), so a field
two services define is one variable for both. That is safe only when it means the same thing to each:
this lists every such field and checks it has one type and one default everywhere. A new collision
(as ``drain_timeout_s`` was: the gateway's weight-update drain and the worker's shutdown drain under
one variable) fails here until it is renamed or added, with its reason, to ``SHARED``."""

from __future__ import annotations

import itertools

import pytest

from gateway.settings import GatewaySettings
from infra.application.stack import StackSettings
from infra.eventlog.settings import EventLogSettings
from infra.settings import FlywheelSettings
from reward_service.settings import RewardSettings
from rollout_worker.settings import WorkerSettings
from trainer.settings import TrainerSettings

pytestmark = pytest.mark.timeout(30)
SERVICES = [GatewaySettings, WorkerSettings, RewardSettings, TrainerSettings, EventLogSettings]
SHARED = {
    "metrics_port": "where this process serves Prometheus (the stack is one process)",
    "gateway_url": "the gateway the worker's agents and the reward service's judge reach",
}


def test_a_field_two_services_define_means_the_same_to_both() -> None:
    base = set(FlywheelSettings.model_fields)
    for a, b in itertools.combinations(SERVICES, 2):
        for name in (set(a.model_fields) & set(b.model_fields)) - base:
            assert name in SHARED, f"{a.__name__} and {b.__name__} both define {name!r}: rename one"
            fa, fb = a.model_fields[name], b.model_fields[name]
            assert (fa.annotation, fa.default) == (fb.annotation, fb.default), name


def test_the_stack_carries_every_service_field() -> None:
    fields = set(StackSettings.model_fields)
    for service in SERVICES:
        assert set(service.model_fields) <= fields, service.__name__
