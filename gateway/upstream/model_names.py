"""The model name the engine is asked for: the agent's when the engine serves it, else the served one.

An agent written for a hosted API asks for ``gpt-4o-mini``. The embedded engine serves any name, but
vLLM serves only the names it was started with (``--served-model-name``, Flywheel's ``policy``) and its
loaded LoRA adapters, and answers any other with a 404. So with ``FLYWHEEL_MODEL_NAMES=served`` (the
default) the gateway sends a call whose model the engine does not serve under the engine's served name,
on every engine alike. A name is kept when it is

- the served name (``FLYWHEEL_MODEL``), a policy's name (``FLYWHEEL_POLICIES``) or a routed name
  (``FLYWHEEL_GATEWAY_MODEL_ROUTES``, which goes to its own upstream as asked);
- an adapter's versioned name (``terse@v3``: the release router's, ``gateway/releases.py``). A
  whole-model version (``policy@v12``) is served by a slot under the slot's own name (a vLLM slot
  serves only ``policy``), so it goes by the rule like any other name;
- listed in the upstream's ``/v1/models`` (its base and the adapters loaded there; read at most once
  per ``ttl_s`` per upstream, and only for a name not kept already).

Any other name (and an empty one) is replaced by the base that ``/v1/models`` lists (the entry without a
``parent``), or by ``FLYWHEEL_MODEL`` when the upstream does not list its models. A call that a policy
selects is sent under its adapter's name before this rule is asked (``gateway/serving.py``). An
``openai`` upstream (a hosted API) is always asked for the agent's own name, as is every upstream with
``FLYWHEEL_MODEL_NAMES=passthrough``.

What is recorded and answered: ``LLMCallRecorded.model`` (and ``request``) keep the name the agent asked
for; the recorded ``response`` is the engine's, naming the model that served the call; the answer the
agent gets names the model it asked for, as OpenAI's answers name a concrete model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import httpx

from gateway.upstream.client import Upstream, UpstreamPool
from gateway.upstream.routing import RoutedPool
from infra.logging import get_logger
from infra.policies import PolicyMap
from infra.releases import parse_versioned
from schemas import UpstreamKind

if TYPE_CHECKING:  # gateway.settings imports this module's mode
    from gateway.settings import GatewaySettings

log = get_logger("gateway.model_names")

ModelNamesMode = Literal["served", "passthrough"]


@dataclass(frozen=True, slots=True)
class Listing:
    """An upstream's ``/v1/models``: every name it lists and its base (None: it did not answer)."""

    names: frozenset[str]
    base: str | None
    at: float


class ModelNames:
    """Which name each call's upstream is asked for (the module docstring states the rule)."""

    def __init__(
        self,
        served: str,
        *,
        keep: Iterable[str] = (),
        mode: ModelNamesMode = "served",
        ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.served = served
        self.keep = frozenset([served, *keep])
        self.mode = mode
        self.ttl_s = ttl_s
        self.clock = clock
        self._listings: dict[str, Listing] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._warned: set[str] = set()

    def kept(self, asked: str) -> bool:
        """Whether ``asked`` is sent as it is without asking the upstream."""
        if self.mode == "passthrough" or asked in self.keep:
            return True
        versioned = parse_versioned(asked)
        return versioned is not None and versioned[0] != self.served

    async def replacement(self, upstream: Upstream, asked: str) -> str | None:
        """The name to send ``upstream`` instead of ``asked``; None: send ``asked``."""
        if upstream.kind is UpstreamKind.openai or (asked and self.kept(asked)):
            return None
        listing = await self.listing(upstream)
        if asked and asked in listing.names:
            return None
        name = listing.base or self.served
        if asked and asked not in self._warned and len(self._warned) < 1024:
            self._warned.add(asked)  # once per name: an agent's every call would repeat it
            log.info("model not served upstream: sent under the served name", asked=asked, sent=name)
        return name

    async def listing(self, upstream: Upstream) -> Listing:
        """``upstream``'s models, read again once older than ``ttl_s`` (a failed read too is kept that long)."""
        url = upstream.url
        cached = self._listings.get(url)
        if cached is not None and self.clock() - cached.at < self.ttl_s:
            return cached
        async with self._locks.setdefault(url, asyncio.Lock()):
            cached = self._listings.get(url)
            if cached is not None and self.clock() - cached.at < self.ttl_s:
                return cached
            names, base = await _read_models(upstream)
            listing = self._listings[url] = Listing(names, base, self.clock())
            return listing


async def _read_models(upstream: Upstream) -> tuple[frozenset[str], str | None]:
    root = str(upstream.client.base_url).rstrip("/").removesuffix("/v1")
    try:
        r = await upstream.client.get(root + "/v1/models", timeout=min(10.0, upstream.timeout_s))
        listing = r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return frozenset(), None
    data = listing.get("data") if isinstance(listing, dict) else None
    entries = [
        e
        for e in (data if isinstance(data, list) else [])
        if isinstance(e, dict) and isinstance(e.get("id"), str)
    ]
    base = next((e["id"] for e in entries if e["id"] and not e.get("parent")), None)
    return frozenset(e["id"] for e in entries), base


def build_model_names(settings: GatewaySettings, pool: UpstreamPool) -> ModelNames:
    """The gateway's rule: ``FLYWHEEL_MODEL`` served, policy and routed names kept as asked."""
    routed = list(pool.routes) if isinstance(pool, RoutedPool) else []
    policies = PolicyMap.parse(settings.policies).names
    return ModelNames(settings.model, keep=[*policies, *routed], mode=settings.model_names)
