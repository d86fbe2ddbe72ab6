"""The model-name rule (gateway/upstream/model_names.py): which name each upstream is asked for."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from gateway.settings import GatewaySettings
from gateway.upstream.client import UpstreamPool, make_upstream
from gateway.upstream.model_names import ModelNames, build_model_names
from gateway.upstream.routing import build_pool
from schemas import UpstreamKind
from tests.fakes.upstream import FakeUpstreamConfig

pytestmark = pytest.mark.timeout(30)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _listings(cfg: FakeUpstreamConfig) -> tuple[httpx.MockTransport, list[int]]:
    """The fake's ``/v1/models`` answered by a transport that counts its reads."""
    reads: list[int] = []

    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/models", request.url
        reads.append(1)
        if cfg.fail_next:
            return httpx.Response(cfg.fail_next.pop(0))
        base, *adapters = cfg.served_names or [cfg.model]
        data = [{"id": base}, *({"id": a, "parent": base} for a in adapters)]
        return httpx.Response(200, json={"object": "list", "data": data})

    return httpx.MockTransport(handle), reads


async def test_names_the_upstream_does_not_list_go_under_its_base() -> None:
    cfg = FakeUpstreamConfig(served_names=["SmolLM2", "terse"])
    transport, reads = _listings(cfg)
    up = make_upstream("http://vllm/v1", transport=transport)
    clock = Clock()
    names = ModelNames("policy", keep=["writer", "checker"], clock=clock, ttl_s=30.0)
    # kept without asking the upstream: the served name, policies, routes, an adapter's versions
    for kept in ("policy", "writer", "checker", "terse@v3"):
        assert await names.replacement(up, kept) is None
    assert reads == []
    assert await names.replacement(up, "gpt-4o-mini") == "SmolLM2"  # the listed base, not FLYWHEEL_MODEL
    assert await names.replacement(up, "policy@v12") == "SmolLM2"  # a slot serves its version by its name
    assert await names.replacement(up, "") == "SmolLM2"
    assert await names.replacement(up, "terse") is None  # an adapter loaded there
    assert await names.replacement(up, "SmolLM2") is None
    assert len(reads) == 1  # one read per ttl_s
    clock.now = 31.0
    cfg.served_names = ["SmolLM2", "terse", "late"]
    assert await names.replacement(up, "late") is None
    assert len(reads) == 2


async def test_an_upstream_that_does_not_list_gets_the_served_name_and_is_not_asked_again() -> None:
    cfg = FakeUpstreamConfig(fail_next=[500])
    transport, reads = _listings(cfg)
    up = make_upstream("http://vllm/v1", transport=transport)
    names = ModelNames("policy", clock=Clock())
    assert await names.replacement(up, "gpt-4o-mini") == "policy"
    assert await names.replacement(up, "claude") == "policy"
    assert len(reads) == 1


async def test_a_hosted_api_and_passthrough_get_the_agents_name() -> None:
    transport, reads = _listings(FakeUpstreamConfig())
    hosted = make_upstream("https://api.example/v1", kind=UpstreamKind.openai, transport=transport)
    assert await ModelNames("policy").replacement(hosted, "gpt-4o-mini") is None
    vllm = make_upstream("http://vllm/v1", transport=transport)
    assert await ModelNames("policy", mode="passthrough").replacement(vllm, "gpt-4o-mini") is None
    assert reads == []


def test_the_gateways_rule_keeps_its_policies_and_routed_names(tmp_path: Path) -> None:
    settings = GatewaySettings(
        data_dir=tmp_path,
        model="base",
        policies='{"acme": {"tenants": ["acme"]}}',
        gateway_model_routes="checker=http://10.0.0.5:8000/v1",
    )
    pool = build_pool(
        [make_upstream("http://vllm/v1")], settings.gateway_model_routes, kind=UpstreamKind.vllm
    )
    names = build_model_names(settings, pool)
    assert names.served == "base" and names.mode == "served"
    assert all(names.kept(n) for n in ("base", "acme", "checker"))
    assert not names.kept("gpt-4o-mini")
    plain = build_model_names(
        GatewaySettings(data_dir=tmp_path, model_names="passthrough"),
        UpstreamPool([make_upstream("http://vllm/v1")]),
    )
    assert plain.kept("gpt-4o-mini")
