"""Route requested model names to upstreams: one role of a multi-agent program to a fixed model.

A program whose roles ask for different model names (a SQL agent's ``writer``, ``rewriter`` and
``checker``) needs no code change for its roles to be served by different models: the gateway sends a
call whose ``model`` is a routed name to that route's upstream, and every other call to the default
upstreams (the policy being trained). Every call is recorded either way, with the upstream that
answered it (``LLMCallRecorded.upstream_url``); which calls train is the reward service's choice
(``reward_service/selection.py``).

``FLYWHEEL_GATEWAY_MODEL_ROUTES='checker=http://10.0.0.5:8000/v1,judge=openai+https://api.example/v1'``:
comma-separated ``name=url``; a ``kind+`` prefix on the URL (``vllm``, ``embedded``, ``openai``) sets the
upstream's kind (default: the gateway's ``upstream_kind``). An ``openai`` upstream is asked for no token
ids or logprobs, so its calls are recorded as not token-faithful: context, never transitions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gateway.upstream.client import Upstream, UpstreamPool, make_upstream
from schemas import UpstreamKind


@dataclass(frozen=True, slots=True)
class Route:
    model: str
    url: str
    kind: UpstreamKind | None = None  # None: the gateway's default kind


def parse_routes(text: str) -> list[Route]:
    """``"name=url,name=kind+url"`` → routes; a malformed entry raises ``ValueError`` naming it."""
    routes: list[Route] = []
    seen: set[str] = set()
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        model, sep, url = (part.strip() for part in entry.partition("="))
        if not sep or not model or not url:
            raise ValueError(f"model route {entry!r} is not 'name=url'")
        if model in seen:
            raise ValueError(f"model {model!r} is routed twice")
        seen.add(model)
        kind: UpstreamKind | None = None
        prefix, plus, rest = url.partition("+")
        if plus and not prefix.startswith("http"):
            try:
                kind = UpstreamKind(prefix)
            except ValueError:
                names = ", ".join(k.value for k in UpstreamKind)
                raise ValueError(f"model route {entry!r}: unknown kind {prefix!r} ({names})") from None
            url = rest
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"model route {entry!r}: the URL must start with http:// or https://")
        routes.append(Route(model, url, kind))
    return routes


class RoutedPool(UpstreamPool):
    """The default replicas plus one pool per routed model name; ``pick`` looks at the model asked for."""

    def __init__(
        self,
        upstreams: Sequence[Upstream],
        routes: Mapping[str, Sequence[Upstream]],
        *,
        retries: int = 2,
        backoff_s: float = 0.2,
    ) -> None:
        super().__init__(upstreams, retries=retries, backoff_s=backoff_s)
        self.routes = {
            model: UpstreamPool(ups, retries=retries, backoff_s=backoff_s) for model, ups in routes.items()
        }

    def pick(self, episode_id: str, model: str = "") -> Upstream:
        routed = self.routes.get(model)
        return routed.pick(episode_id) if routed is not None else super().pick(episode_id)

    async def aclose(self) -> None:
        await super().aclose()
        for pool in self.routes.values():
            await pool.aclose()


def build_pool(
    upstreams: Sequence[Upstream],
    routes_text: str,
    *,
    kind: UpstreamKind,
    api_key: str = "",
    timeout_s: float = 120.0,
    retries: int = 2,
    backoff_s: float = 0.2,
) -> UpstreamPool:
    """The gateway's pool: plain when nothing is routed, else a :class:`RoutedPool`."""
    routes = parse_routes(routes_text)
    if not routes:
        return UpstreamPool(upstreams, retries=retries, backoff_s=backoff_s)
    routed = {
        r.model: [make_upstream(r.url, kind=r.kind or kind, api_key=api_key, timeout_s=timeout_s)]
        for r in routes
    }
    return RoutedPool(upstreams, routed, retries=retries, backoff_s=backoff_s)
