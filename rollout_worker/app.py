"""The rollout worker, wired: ``build`` is its one constructor. ``flywheel.assembly.build_worker``
calls it for every entry point (the embedded stack, ``agl-server``, and ``flywheel worker``, which runs
it alone through ``flywheel.alone``); the worker itself is ``rollout_worker.service``."""

from __future__ import annotations

from infra.bus.base import Bus
from rollout_worker.service import RolloutWorker
from rollout_worker.settings import WorkerSettings


def build(settings: WorkerSettings, bus: Bus) -> RolloutWorker:
    """The worker on ``bus`` (the caller owns and starts it), then ``await worker.start()``."""
    return RolloutWorker(bus, settings)
