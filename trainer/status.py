"""The trainer's state as one model: what ``TrainerService.status()`` returns, what ``status.json`` holds
(written every step and while paused) and what ``flywheel trainer status`` reads back.

``metrics`` are the last step's figures (``schemas.StepMetrics``, as in ``TrainerStepCompleted``);
``samples`` counts the transitions trained so far per episode
source (``live``, ``production``, ``replay``); ``skipped`` the events the intake refused and ``excluded``
what the batches left out (no signal, no reward, and under a lag bound stale transitions), per reason.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from infra.logging import get_logger
from schemas import StepMetrics

log = get_logger(__name__)

STATUS_FILE = "status.json"


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
    skipped: dict[str, int] = Field(default_factory=dict)  # events the intake refused, per reason
    # episodes or transitions the batches left out since the trainer started, per reason (trainer.batching)
    excluded: dict[str, int] = Field(default_factory=dict)
    known_gateways: list[str] = Field(default_factory=list)
    metrics: StepMetrics = Field(default_factory=StepMetrics)
    updated_at: float = 0.0
    # LoRA policies (trainer/policy_service.py): each adapter's trained and serving version
    adapters: dict[str, int] = Field(default_factory=dict)
    serving_adapters: dict[str, int] = Field(default_factory=dict)


def read_status(root: Path) -> TrainerStatus | None:
    """The status a trainer last wrote under ``root`` (None: none, or unreadable, which is logged)."""
    path = root / STATUS_FILE
    try:
        return TrainerStatus.model_validate_json(path.read_bytes()) if path.exists() else None
    except (OSError, ValueError) as exc:
        log.warning("status_unreadable", path=str(path), error=str(exc))
        return None


def write_status(root: Path, status: TrainerStatus) -> None:
    """Replace ``root/status.json`` atomically; a failed write is logged, never raised (the loop goes on)."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = root / (STATUS_FILE + ".tmp")
        tmp.write_text(status.model_dump_json(indent=1))
        tmp.replace(root / STATUS_FILE)
    except OSError as exc:
        log.warning("status_write_failed", error=str(exc))
