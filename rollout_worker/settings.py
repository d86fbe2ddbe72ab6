"""Rollout worker settings (``FLYWHEEL_*`` environment variables). Built in ``main()``."""

from __future__ import annotations

import os
import socket

from pydantic import Field

from infra.settings import FlywheelSettings
from schemas import EpisodeStatus


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


class WorkerSettings(FlywheelSettings):
    metrics_port: int | None = None  # serve Prometheus /metrics on this port when set
    gateway_url: str = (
        "http://127.0.0.1:8100"  # the gateway's port; agents call {gateway_url}/episodes/{id}/v1
    )
    pool: str | None = None  # consume flywheel.tasks.<pool> instead of flywheel.tasks
    worker_group: str = "rollout-workers"
    worker_id: str = Field(default_factory=_default_worker_id)
    concurrency: int = Field(default=16, ge=1, le=4096)
    retry_statuses: list[EpisodeStatus] = Field(default=[EpisodeStatus.error, EpisodeStatus.timeout])
    kill_grace_s: float = Field(default=2.0, ge=0)  # SIGTERM → SIGKILL for a process group past its deadline
    stderr_tail_chars: int = Field(default=4000, ge=100)
    # Command agents run this much nicer (lower CPU priority) than the worker. The worker's loop is on
    # every episode's critical path (and, embedded, so is the gateway's): when many agent processes
    # start at once on few cores, equal priority left it queued behind them, adding tens of ms to every
    # episode. 0 = same priority as the worker.
    agent_nice: int = Field(default=10, ge=0, le=19)
    shutdown_drain_timeout_s: float = Field(default=30.0, ge=0)  # graceful stop: then hand back the rest
    batch_wait_s: float = Field(default=0.05, ge=0)
    # Kubernetes Jobs (kind=kubernetes)
    k8s_namespace: str = "default"
    k8s_jobs_per_minute: int = Field(default=60, ge=1)
    k8s_ttl_after_finished_s: int = Field(default=600, ge=0)
    k8s_poll_s: float = Field(default=2.0, gt=0)
