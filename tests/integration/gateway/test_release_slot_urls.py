"""Slots named by ``FLYWHEEL_RELEASE_SLOT_URLS``: production calls go to the first over real HTTP, and the
gateway closes the connections it opened to them when it stops (they are its own; a host's in-process
slots are the host's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fakes.gateway_harness import GatewayHarness
from tests.fakes.upstream import BackgroundUpstream

pytestmark = pytest.mark.timeout(60)


async def test_production_goes_to_the_served_slot_and_its_connections_close_with_the_gateway(
    tmp_path: Path,
) -> None:
    with BackgroundUpstream() as slot:
        async with GatewayHarness(tmp_path, releases="gated", release_slot_urls=slot.url) as h:
            _, key = h.keystore.create("acme")
            r = await h.client.post(
                "/v1/chat/completions",
                headers={"Authorization": f"Bearer {key}", "X-Flywheel-Session": "s1"},
                json={"model": "policy", "messages": [{"role": "user", "content": "hi"}]},
            )
            assert r.status_code == 200, r.text
            router = h.gateway.releases
            assert router is not None and len(router.owned) == 1
            [upstream] = router.owned
            assert upstream.wire is not None
            assert upstream.wire._idle, "the call went through the slot's own connection"
        assert router.owned == [] and upstream.wire._closed and not upstream.wire._idle
        assert upstream.client.is_closed
