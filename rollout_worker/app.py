"""The rollout worker, wired and run: ``build`` (the CLI and the embedded stack call it with their bus)
and ``main`` (``flywheel worker``, ``python -m rollout_worker.app``), which runs it alone with
``infra.service.serve`` until SIGINT/SIGTERM; the worker itself is ``rollout_worker.service``."""

from __future__ import annotations

from infra import service
from infra.bus.base import Bus
from infra.logging import configure_logging
from rollout_worker.service import RolloutWorker
from rollout_worker.settings import WorkerSettings


def build(settings: WorkerSettings, bus: Bus) -> RolloutWorker:
    """The worker, for every entry point (the embedded stack and agl-server via ``infra.application.assembly``)."""
    return RolloutWorker(bus, settings)


async def serve(settings: WorkerSettings) -> None:
    """Run one worker alone until SIGINT/SIGTERM (it drains its episodes before it stops)."""
    await service.serve(
        settings, lambda bus: build(settings, bus), name="worker", metrics_port=settings.metrics_port
    )


def main() -> None:
    settings = WorkerSettings()
    configure_logging(settings.log_level, settings.log_json)
    service.run(serve(settings))


if __name__ == "__main__":
    main()
