"""Gateway settings, from ``FLYWHEEL_*`` environment variables. Built in ``main()``, never at import."""

from __future__ import annotations

import os
import socket
from typing import Literal

from pydantic import Field, SecretStr, field_validator

from gateway.upstream.routing import parse_routes
from infra.settings import FlywheelSettings
from schemas import LogprobsMode, UpstreamKind


def _default_gateway_id() -> str:
    return f"gw-{socket.gethostname()}-{os.getpid()}"


class GatewaySettings(FlywheelSettings):
    # HTTP
    gateway_host: str = "127.0.0.1"
    gateway_port: int = 8100
    # a scrape-only bearer token /metrics takes besides the admin token (/metrics needs one of them)
    metrics_token: SecretStr = SecretStr("")
    gateway_id: str = Field(default_factory=_default_gateway_id)
    public_url: str = ""  # how agents reach this gateway (for printed episode URLs); empty: host:port
    max_body_bytes: int = 8 * 1024 * 1024
    # largest OTLP/HTTP body an agent may send to /v1/traces (gzipped: once inflated); 413 beyond. The
    # request body limit above applies first
    otlp_max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)

    # upstreams (used by the CLI; services embedding the gateway pass upstream objects directly)
    upstream_urls: str = "http://127.0.0.1:8000/v1"  # comma-separated replicas, sticky per episode
    upstream_kind: UpstreamKind = UpstreamKind.vllm
    upstream_api_key: str = ""
    logprobs_mode: LogprobsMode = LogprobsMode.processed
    upstream_timeout_s: float = 120.0
    upstream_retries: int = 2
    upstream_backoff_s: float = 0.2
    request_weight_versions: bool = False  # ask vLLM for per-token weight versions
    # the fingerprint of the policy upstream's tokenizer, recorded with each call it serves
    # (`flywheel model fingerprint DIR`; `flywheel up` sets it from its model); "": not known
    tokenizer_fingerprint: str = Field(default="", max_length=64)
    # the HTTP client to plain-http upstreams: gateway/upstream/wire.py's keep-alive client, or httpx
    # (what the wire client buys: tests/benchmarks/gateway.py, target gateway_memory_httpx)
    upstream_client: Literal["wire", "httpx"] = "wire"
    # tokens-in: a chat call that extends the previous one exactly starts from its recorded ids on the
    # embedded engine (gateway/upstream/tokens_in.py)
    tokens_in: bool = True
    # requested model name → its own upstream, "name=url,..." (gateway/upstream/routing.py); others:
    # the default
    gateway_model_routes: str = ""
    # a call whose model the policy's engine does not serve (an agent's "gpt-4o-mini"): "served" sends
    # it under the engine's served name (FLYWHEEL_MODEL, or the base its /v1/models lists) and answers
    # with the name asked; "passthrough" sends the agent's name as it is (gateway/upstream/model_names.py)
    model_names: Literal["served", "passthrough"] = "served"

    @field_validator("gateway_model_routes")
    @classmethod
    def _routes(cls, value: str) -> str:
        parse_routes(value)  # a malformed route fails at startup, with the entry named
        return value

    # episodes and sessions
    episode_wait_s: float = 2.0  # how long a call for an unknown episode waits for EpisodeStarted
    max_episodes: int = 20_000  # per-episode state kept in memory (LRU beyond this)
    episodes_from_beginning: bool = True
    # with FLYWHEEL_EPISODE_KEY: how long the signed URL of an episode opened by hand stays valid
    opened_episode_ttl_s: float = Field(default=24 * 3600.0, gt=0)
    # at start, how long calls wait for the episodes topic to be read to its end (call_seq numbering)
    catch_up_timeout_s: float = Field(default=30.0, ge=0, le=600)

    # per-tenant quotas (gateway/quotas.py), each a 429 with Retry-After when a tenant is past it
    tenant_max_sessions: int = Field(default=5_000, ge=0)  # open production sessions of one tenant; 0: no cap
    # Responses API bytes kept for previous_response_id per tenant (its own oldest go first). 0: no cap
    tenant_response_store_bytes: int = Field(default=16 * 1024 * 1024, ge=0)
    # calls per tenant per minute (a token bucket: a minute's worth at once, refilled evenly). 0: no limit
    tenant_requests_per_minute: int = Field(default=0, ge=0)
    # prompt + completion tokens per tenant per minute, as recorded; refused while spent. 0: no limit
    tenant_tokens_per_minute: int = Field(default=0, ge=0)

    # pause/resume and publishing
    pause_hold_s: float = 30.0  # a new call waits this long while paused, then 503 + Retry-After
    pause_drain_timeout_s: float = 30.0  # a weight update's drain when its WeightUpdateRequested names none
    initial_weight_version: int = 0

    # releases (gateway/releases.py): "off" serves every call at the trainer's latest version; "gated"
    # serves production calls at the version the release book serves (promote/rollback/pin, gates)
    releases: Literal["off", "gated"] = "off"
    # `flywheel engine` servers (comma-separated .../v1 URLs) that serve fixed whole-model versions:
    # the first production's, the second the versions evaluation rollouts name; none: adapters only
    release_slot_urls: str = ""
    # what those slots are: `flywheel engine` servers (POST /load_weights) or vLLM servers in dev mode
    # (VLLM_SERVER_DEV_MODE=1: pause, reload_weights from the version's directory, resume)
    release_slot_kind: Literal["engine", "vllm"] = "engine"
    # the starting weights (version 0, a model directory) a slot loads when production returns to it
    release_base_path: str = ""
