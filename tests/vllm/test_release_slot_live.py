"""Whole-model versions on vLLM: the served version in a vLLM of its own (docs/operating.md, "Releasing
versions").

The gateway with ``FLYWHEEL_RELEASES=gated``, ``FLYWHEEL_RELEASE_SLOT_KIND=vllm`` and the live vLLM as its
production slot. Version 1 (the served model with its final norm negated: greedy decoding picks other
tokens) is proposed and promoted through the admin API; the next production call is answered by vLLM
after an in-place reload from the version's directory and recorded at version 1. Rolled back, the slot
reloads the starting weights (``FLYWHEEL_RELEASE_BASE_PATH``) and production answers as before, recorded
at version 0.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from infra.vllm.reload import VllmReloader
from schemas import CONTROL, LLMCallRecorded, VersionProposed
from tests.fakes.gateway_harness import ADMIN, GatewayHarness
from tests.vllm.conftest import SERVED_NAME
from tests.vllm.test_sink_live import flipped_copy

pytestmark = pytest.mark.timeout(600)


async def test_production_is_served_by_the_promoted_whole_model_version_in_its_own_vllm(
    warm: str, vllm_model_dir: Path, tmp_path: Path
) -> None:
    flipped = flipped_copy(vllm_model_dir, tmp_path / "v1")
    async with httpx.AsyncClient(timeout=300.0) as plain:
        before = (await plain.get(warm + "/weight_info")).json()["weight_version"]
    settings: dict[str, Any] = {
        "releases": "gated",
        "release_slot_urls": warm + "/v1",
        "release_slot_kind": "vllm",
        "release_base_path": str(vllm_model_dir),
        "upstream_timeout_s": 300.0,
    }
    async with GatewayHarness(tmp_path / "gw", **settings) as h:
        _, key = h.keystore.create("acme")
        user = {"Authorization": f"Bearer {key}"}

        async def production(session: str) -> tuple[str, LLMCallRecorded]:
            r = await h.client.post(
                "/v1/chat/completions",
                headers={**user, "X-Flywheel-Session": session},
                json={
                    "model": SERVED_NAME,
                    "messages": [{"role": "user", "content": "The capital of France is"}],
                    "max_tokens": 8,
                    "temperature": 0.0,
                },
                timeout=300.0,
            )
            assert r.status_code == 200, r.text
            episode = r.headers["x-flywheel-episode"]
            [call] = await h.events.wait_for(
                lambda e: isinstance(e, LLMCallRecorded) and e.episode_id == episode, 30.0, 1
            )
            return str(r.json()["choices"][0]["message"]["content"]), call

        try:
            original, call0 = await production("s-before")
            assert call0.weight_version == 0
            await h.bus.publish(
                CONTROL, VersionProposed(producer="test", version=1, checkpoint_path=str(flipped), step=1)
            )
            for _ in range(100):  # the gateway learns it from the control topic
                if (await h.client.get("/admin/versions/1", headers=ADMIN)).status_code == 200:
                    break
                await asyncio.sleep(0.1)
            promoted = await h.client.post(
                "/admin/versions/promote", json={"version": 1, "by": "t"}, headers=ADMIN
            )
            assert promoted.status_code == 200, promoted.text
            served, call1 = await production("s-promoted")
            assert call1.weight_version == 1 and served != original, (served, original)
            async with httpx.AsyncClient(timeout=300.0) as plain:
                assert (await plain.get(warm + "/weight_info")).json()["weight_version"] == "1"
            rolled = await h.client.post("/admin/versions/rollback", json={"by": "t"}, headers=ADMIN)
            assert rolled.status_code == 200, rolled.text
            again, call2 = await production("s-rolled-back")
            assert call2.weight_version == 0 and again == original
        finally:  # the shared server back on its own weights and label, whatever happened
            async with httpx.AsyncClient(timeout=300.0) as plain:
                await VllmReloader(warm, plain).reload(vllm_model_dir, str(before))
