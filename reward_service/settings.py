"""Reward service settings (``FLYWHEEL_*`` environment variables). Built in ``main()``."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr

from infra.settings import FlywheelSettings


class RewardSettings(FlywheelSettings):
    metrics_port: int | None = None  # serve Prometheus /metrics on this port when set
    reward_group: str = "reward-service"
    fill_value: float = 0.0  # agent scorer: the reward of an episode that reported none (marked "filled")
    discount: float = Field(default=1.0, ge=0.0, le=1.0)  # per-call discount (options.discount overrides)
    # durable episode state without the changelog; default: <data_dir>/reward/<group>.sqlite on Kafka
    journal: Path | None = None
    # On Kafka, the state goes to the changelog topic flywheel.reward-state instead of the journal and
    # follows the partitions of flywheel.episodes between instances (reward_service/changelog.py).
    # Off: one instance per journal (a partition moved mid-episode is scored from what the new owner saw).
    reward_changelog: bool = True
    abandon_grace_s: float = Field(default=60.0, ge=0)  # live episodes past deadline + grace: abandoned
    group_timeout_s: float = Field(default=600.0, gt=0)  # judge ranking: rank what arrived after this
    sweep_interval_s: float = Field(default=1.0, gt=0)
    production_scorer: str = "none"  # production sessions without feedback: a scorer name, or "none"
    feedback_scale: Literal["thumbs", "stars"] = "thumbs"  # thumbs: -1/0/1 → 0/0.5/1; stars: 1..max → 0..1
    feedback_stars_max: int = Field(default=5, ge=2)
    feedback_ratings: dict[str, float] = Field(default_factory=dict)  # explicit rating → reward overrides
    # scored production sessions kept for late feedback (state.py: a few bytes per token each, in the
    # journal, or in memory without one), also bounded by feedback_window_s
    feedback_retain: int = Field(default=10_000, ge=0)
    gateway_url: str = "http://127.0.0.1:8100"  # the gateway's default port
    judge_base_url: str = ""  # default: {gateway_url}/v1
    judge_api_key: SecretStr = SecretStr("")
    judge_model: str = "policy"
    max_batch: int = Field(default=500, ge=1)
    # How long a batch waits to fill once its first event arrived: every episode's score waits up to
    # this long (the bus's default, 0.2 s, was a fixed delay on every group's completion).
    reward_batch_wait_s: float = Field(default=0.05, ge=0)
    scorer_timeout_s: float = Field(default=120.0, gt=0)
    # selective training (reward_service/selection.py): the model names / system-prompt regex whose calls
    # become transitions; the other calls are kept as context. Empty: every call trains.
    train_models: str = ""
    train_system_match: str = ""

    def changelog(self) -> bool:
        return self.reward_changelog and self.bus == "kafka"

    def journal_path(self) -> Path | None:
        if self.changelog():
            return None  # the changelog holds the state
        if self.journal is not None:
            return self.journal
        if self.bus != "kafka":
            return None  # the in-process bus does not outlive the process either
        return self.data_dir / "reward" / f"{self.topic_prefix}{self.reward_group}.sqlite"
