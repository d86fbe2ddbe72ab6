"""The services' default ports fit together when each runs alone on one host (README, "flywheel engine")."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from flywheel.cli.engine_cmd import DEFAULT_PORT
from gateway.settings import GatewaySettings
from reward_service.settings import RewardSettings
from rollout_worker.settings import WorkerSettings

pytestmark = pytest.mark.timeout(10)


def _default(settings: type[object], field: str) -> object:
    return settings.model_fields[field].default  # type: ignore[attr-defined]


def test_the_default_ports_point_at_each_other() -> None:
    upstream = str(_default(GatewaySettings, "upstream_urls")).split(",")[0]
    assert urlsplit(upstream).port == DEFAULT_PORT == 8000  # gateway → flywheel engine
    gateway_port = _default(GatewaySettings, "gateway_port")
    assert gateway_port == 8100 != DEFAULT_PORT
    for settings in (WorkerSettings, RewardSettings):  # worker, reward service → gateway
        assert urlsplit(str(_default(settings, "gateway_url"))).port == gateway_port, settings.__name__
