"""Model routes: parsing (bad entries named), picking by the requested model, the settings check."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings
from gateway.upstream.client import UpstreamPool, make_upstream
from gateway.upstream.routing import Route, RoutedPool, build_pool, parse_routes
from schemas import UpstreamKind
from tests.fakes.gateway_harness import GatewayHarness


def test_parse_routes() -> None:
    assert parse_routes("") == []
    assert parse_routes(" checker = http://h:1/v1 , judge=openai+https://api.x/v1") == [
        Route("checker", "http://h:1/v1"),
        Route("judge", "https://api.x/v1", UpstreamKind.openai),
    ]
    for bad, word in [
        ("checker", "name=url"),
        ("=http://h/v1", "name=url"),
        ("c=ftp://h", "http"),
        ("c=nope+http://h/v1", "unknown kind"),
        ("c=http://a/v1,c=http://b/v1", "twice"),
    ]:
        with pytest.raises(ValueError, match=word):
            parse_routes(bad)
    with pytest.raises(ValidationError, match="name=url"):
        GatewaySettings(gateway_model_routes="checker")


async def test_pick_by_model_and_default() -> None:
    policy = [make_upstream(f"http://policy{i}/v1", wire=False) for i in range(2)]
    pool = build_pool(policy, "", kind=UpstreamKind.vllm)
    assert type(pool) is UpstreamPool
    routed = build_pool(policy, "checker=openai+http://fixed:9/v1", kind=UpstreamKind.embedded)
    assert isinstance(routed, RoutedPool)
    try:
        checker = routed.pick("ep1", "checker")
        assert checker.url == "http://fixed:9/v1" and checker.kind is UpstreamKind.openai
        assert not checker.token_faithful
        for ep in ("ep1", "ep2", "ep3"):
            assert routed.pick(ep, "writer") is routed.pick(ep) is pool.pick(ep)  # unknown → default
        assert routed.pick("ep1", "writer") in policy
    finally:
        await routed.aclose()


async def test_gateway_state_lists_its_routes(tmp_path: Path) -> None:
    async with GatewayHarness(tmp_path, gateway_model_routes="checker=openai+http://fixed:9/v1") as h:
        state = h.gateway.state()
        assert state["model_routes"] == {"checker": [{"url": "http://fixed:9/v1", "kind": "openai"}]}
        assert state["upstreams"] == [{"url": "http://fake0/v1", "kind": "vllm"}]
