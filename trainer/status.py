"""The trainer's state as one model: what ``TrainerService.status()`` returns, what ``status.json`` holds
(written every step and while paused) and what ``flywheel trainer status`` reads back.

``metrics`` are the last step's figures (``schemas.StepMetrics``, as in ``TrainerStepCompleted``);
``samples`` counts the transitions trained so far per episode
source (``live``, ``production``, ``replay``).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from schemas import StepMetrics


class TrainerStatus(BaseModel):
    model_config = ConfigDict(extra="ignore")  # a newer trainer's status.json still reads

    model: str = "policy"
    step: int = Field(default=0, ge=0)
    version: int = Field(default=0, ge=0)
    serving_version: int = Field(default=0, ge=0)
    paused: bool = False
    pause_reason: str = ""
    mode: str = "async"
    pending_groups: int = 0
    pending_production: int = 0
    ready_groups: int = 0
    samples: dict[str, int] = Field(default_factory=dict)
    skipped: dict[str, int] = Field(default_factory=dict)
    known_gateways: list[str] = Field(default_factory=list)
    metrics: StepMetrics = Field(default_factory=StepMetrics)
    updated_at: float = 0.0
