"""Settings of the recorder service (``flywheel recorder``) and of event-log readers."""

from __future__ import annotations

from pydantic import Field

from infra.settings import FlywheelSettings


class EventLogSettings(FlywheelSettings):
    clickhouse_database: str = Field(default="flywheel", description="database inside chdb or the server")
    admin_url: str = Field(default="", description="admin API of the process holding the chdb directory")
    recorder_host: str = "127.0.0.1"
    recorder_port: int = Field(default=8790, description="the recorder's admin API (event-log reads); 0: off")
    # = infra.eventlog.recorder.MAX_BATCH (why 10k: its comment)
    recorder_max_batch: int = Field(default=10_000, ge=1, le=100_000)
    recorder_max_wait_s: float = Field(default=0.2, gt=0, le=60)
    recorder_task_pools: list[str] = Field(
        default_factory=list,
        description="named worker pools whose flywheel.tasks.<pool> topics to record too (JSON list)",
    )
