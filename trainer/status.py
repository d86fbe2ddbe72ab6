"""The trainer's state as one model: what ``TrainerService.status()`` returns, what ``status.json`` holds
(written every step and while paused) and what ``flywheel trainer status`` reads back.

``metrics`` are the last step's figures (``TrainerStepCompleted.metrics``: name → value, see
``trainer/metrics.py`` for the names); ``samples`` counts the transitions trained so far per episode
source (``live``, ``production``, ``replay``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrainerStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")  # a newer trainer's status.json still reads

    model: str = "policy"
    step: int = Field(default=0, ge=0)
    version: int = Field(default=0, ge=0)
    serving_version: int = Field(default=0, ge=0)
    paused: bool = False
    mode: str = "async"
    pending_groups: int = 0
    pending_production: int = 0
    ready_groups: int = 0
    samples: dict[str, int] = Field(default_factory=dict)
    skipped: dict[str, int] = Field(default_factory=dict)
    known_gateways: list[str] = Field(default_factory=list)
    metrics: dict[str, float] = Field(default_factory=dict)
    updated_at: float = 0.0
