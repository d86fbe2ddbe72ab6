"""Prometheus metrics of one gateway (own registry, so several gateways can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter(
            "flywheel_gateway_calls", "LLM calls handled", ["endpoint", "source", "status"], registry=r
        )
        self.latency = Histogram(
            "flywheel_gateway_call_latency_seconds",
            "call latency (upstream + recording)",
            ["endpoint"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.tokens = Counter("flywheel_gateway_tokens", "tokens seen", ["kind"], registry=r)
        self.paused = Gauge("flywheel_gateway_paused", "1 while paused for a weight update", registry=r)
        self.in_flight = Gauge("flywheel_gateway_in_flight", "calls in flight", registry=r)
        self.spool_depth = Gauge("flywheel_gateway_spool_depth", "events waiting in the spool", registry=r)
        self.prefix_mismatches = Counter(
            "flywheel_gateway_prefix_mismatches", "calls that did not extend the previous one", registry=r
        )
        self.weight_version = Gauge("flywheel_gateway_weight_version", "weight version served", registry=r)
        self.open_episodes = Gauge("flywheel_gateway_open_episodes", "open episodes", registry=r)
        self.forgotten_episodes = Counter(
            "flywheel_gateway_forgotten_episodes",
            "abandoned episodes forgotten (idle, or their ticket expired)",
            ["source"],
            registry=r,
        )
        self.quota_refusals = Counter(
            "flywheel_gateway_quota_refusals",
            "production calls refused for a tenant's quota (gateway/quotas.py)",
            ["tenant", "quota"],
            registry=r,
        )
        self.quota_evictions = Counter(
            "flywheel_gateway_quota_evictions",
            "Responses API responses a tenant's own newer ones pushed out of its response-store quota",
            ["tenant"],
            registry=r,
        )
        # labelled children resolved once: ``labels()`` takes a lock and builds a key on every call
        self.prompt_tokens = self.tokens.labels("prompt")
        self.completion_tokens = self.tokens.labels("completion")
        self._ok: dict[tuple[str, str], tuple[Counter, Histogram]] = {}

    def ok_call(self, endpoint: str, source: str) -> tuple[Counter, Histogram]:
        """The counter of successful calls and the latency histogram for one endpoint and source."""
        children = self._ok.get((endpoint, source))
        if children is None:
            children = self._ok[endpoint, source] = (
                self.calls.labels(endpoint, source, "ok"),
                self.latency.labels(endpoint),
            )
        return children

    def render(self) -> bytes:
        return generate_latest(self.registry)
