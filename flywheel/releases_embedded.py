"""Releases in the embedded stack: the slots that serve fixed versions, and the gate keeper.

With ``releases=gated`` and no ``release_slot_urls``, the stack starts two more embedded engines in its
own process (each behind an ASGI transport, like the main one): the first serves production at the
served version, the second the version an evaluation names (gateway/releases.py). Each holds a copy of
the model's weights, so the stack's weight memory is three times the model's (docs/operating.md,
"Releasing versions"); their KV caches are freed when idle. With ``release_gates`` (a ``gates.json``) it
also runs the :class:`~flywheel.gates.GateKeeper` on its bus.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from flywheel.gates import GateConfig, GateKeeper
from schemas import UpstreamKind

if TYPE_CHECKING:
    from flywheel.stack import EmbeddedStack
    from gateway.settings import GatewaySettings
    from gateway.upstream.client import Upstream

SLOTS = 2


async def start_release_slots(
    stack: EmbeddedStack, gateway: GatewaySettings
) -> tuple[GatewaySettings, list[Upstream]]:
    """The gateway's settings (version 0: the stack's model) and the slots' upstreams (none when releases
    are off, the slots are remote, or the stack serves no model of its own)."""
    from gateway.upstream.client import make_upstream
    from infra.engine.app import create_engine_app
    from infra.engine.core import InferenceEngine

    s = stack.settings
    if gateway.releases == "off" or gateway.release_slot_urls or stack.model_dir is None:
        return gateway, []
    if not gateway.release_base_path:
        gateway = gateway.model_copy(update={"release_base_path": str(stack.model_dir)})
    token = s.admin_token.get_secret_value()
    upstreams: list[Upstream] = []
    for i in range(SLOTS):
        engine = InferenceEngine.from_pretrained(
            Path(stack.model_dir), model_name=s.model, max_num_seqs=s.engine_max_num_seqs
        )
        app = create_engine_app(engine, admin_token=token)
        upstream = make_upstream(
            f"http://release-slot-{i}/v1",
            kind=UpstreamKind.embedded,
            logprobs_mode=gateway.logprobs_mode,
            timeout_s=gateway.upstream_timeout_s,
            transport=httpx.ASGITransport(app=app),
        )
        stack._stoppers.append((f"release-slot-{i}", engine.close))
        stack._stoppers.append((f"release-slot-{i}-client", upstream.client.aclose))
        upstreams.append(upstream)
    return gateway, upstreams


async def start_release_parts(stack: EmbeddedStack) -> GateKeeper | None:
    """Once the gateway and the engine are up: the gateway loads adapter versions into a ``flywheel
    engine`` child with the child's own admin token; and the gate keeper on the stack's bus when
    ``release_gates`` names a configuration."""
    releases = stack.gateway_app.state.gateway.releases if stack.gateway_app is not None else None
    if releases is not None and stack.engine_process is not None:
        releases.admin_token = stack.engine_process.admin_token
    path = stack.settings.release_gates
    if path is None:
        return None
    keeper = GateKeeper(stack._bus, GateConfig.load(path), model=stack.settings.model)
    await keeper.start()
    stack._stoppers.append(("gates", keeper.stop))
    return keeper
