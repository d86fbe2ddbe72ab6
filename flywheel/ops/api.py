"""The ops admin API of a running embedded stack: status and replay, which need its in-process bus.

Mounted by whoever owns the bus (``flywheel up``):
``app.include_router(create_ops_router(OpsContext(...)))``. Every route needs
``Authorization: Bearer <FLYWHEEL_ADMIN_TOKEN>``; errors are OpenAI-shaped.

    GET  /admin/ops/status   → StatusReport (services, lag per topic, gateway, weights, trainer step)
    POST /admin/ops/replay   {"filter": ReplayFilter, "rate": N | null, "dry_run": bool,
                              "pace": {"groups_per_step": B, "step_timeout_s": S} | null} → ReplayReport
                             (paced: 202 at once, the replay runs on; its progress at the next route)
    GET  /admin/ops/replay/{run_id}  → a paced replay's ReplayReport so far, with "state" and "error"
    POST /admin/ops/trainer/pause   {"model": "policy", "reason": "..."} → the TrainerPauseRequested published
    POST /admin/ops/trainer/resume  {"model": "policy"}                  → the TrainerResumeRequested published
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flywheel.ops.status import ControlState, StatusReport, topic_lags
from flywheel.replay import (
    Pace,
    ReplayFilter,
    ReplayFilterError,
    ReplayReport,
    ScoredEpisodeSource,
    replay,
)
from infra.bus.base import Bus, BusError, Subscription
from infra.eventlog.errors import EventLogError
from infra.http import HttpErrorRoute, error_response, require_admin
from schemas import CONTROL, TrainerPauseRequested, TrainerResumeRequested

PREFIX = "/admin/ops"


class PaceRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    groups_per_step: int = Field(ge=1, le=100_000)
    step_timeout_s: float = Field(default=300.0, gt=0, le=86_400)


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    rate: float | None = Field(default=None, gt=0)
    dry_run: bool = False
    pace: PaceRequest | None = None


@dataclass
class ReplayRun:
    """A paced replay running in the stack: its report as it fills in, and how it ended."""

    report: ReplayReport
    task: asyncio.Task[ReplayReport] | None = None

    def as_dict(self) -> dict[str, Any]:
        state, error = "running", None
        if self.task is not None and self.task.done():
            exc = None if self.task.cancelled() else self.task.exception()
            state = "failed" if self.task.cancelled() or exc is not None else "done"
            error = "cancelled" if self.task.cancelled() else (str(exc) if exc is not None else None)
        return {**self.report.as_dict(), "state": state, "error": error}


class PauseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(default="policy", min_length=1)
    reason: str = Field(default="operator", max_length=1024)


@dataclass
class OpsContext:
    """What the routes read: the stack's bus and event log, and how to ask its parts for their state."""

    bus: Bus
    reader: ScoredEpisodeSource
    admin_token: str
    services: Callable[[], dict[str, dict[str, Any]]] = dict
    gateway_state: Callable[[], dict[str, Any] | None] = lambda: None
    control: ControlState = field(default_factory=ControlState)
    replays: dict[str, ReplayRun] = field(default_factory=dict)  # paced replays, by run id
    _sub: Subscription | None = None

    async def watch_control(self) -> None:
        """Follow the control topic (weights, trainer steps) for the status report."""
        await self.bus.ensure_topics([CONTROL])
        group = f"ops-status-{uuid.uuid4().hex[:12]}"
        self._sub = await self.bus.subscribe(CONTROL, group, self.control.handle, from_beginning=True)

    def remember(self, run: ReplayRun, keep: int = 64) -> None:
        """Keep ``run`` for its progress route; the oldest finished runs beyond ``keep`` are forgotten."""
        self.replays[run.report.run_id] = run
        finished = [k for k, r in self.replays.items() if r.task is not None and r.task.done()]
        for key in finished[: max(0, len(self.replays) - keep)]:
            del self.replays[key]

    async def stop(self) -> None:
        for run in self.replays.values():
            if run.task is not None and not run.task.done():
                run.task.cancel()
        if self._sub is not None:
            await self._sub.stop()
            self._sub = None

    async def status(self) -> StatusReport:
        report = StatusReport(runtime="embedded", bus="in-process")
        report.services = self.services()
        report.topics = await topic_lags(self.bus)
        report.gateway = self.gateway_state()
        report.control = self.control.as_dict()
        report.problems = [
            f"{name}: not running" for name, info in report.services.items() if not info.get("up")
        ]
        return report


def _error(status: int, code: str, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return error_response(status, message, kind, code=code)


def create_ops_router(ctx: OpsContext) -> APIRouter:
    router = APIRouter(prefix=PREFIX, tags=["admin"], route_class=HttpErrorRoute)

    def admin_only(request: Request) -> None:
        require_admin(request, ctx.admin_token)

    @router.get("/status", dependencies=[Depends(admin_only)])
    async def status() -> JSONResponse:
        return JSONResponse((await ctx.status()).as_dict())

    @router.post("/replay", dependencies=[Depends(admin_only)])
    async def replay_route(request: Request) -> JSONResponse:
        try:
            body = ReplayRequest.model_validate_json(await request.body())
            body.filter.to_episode_filter()  # cross-field checks, before a paced run is started
            pace = Pace(body.pace.groups_per_step, body.pace.step_timeout_s) if body.pace else None
            if pace is not None and not body.dry_run:
                run = ReplayRun(ReplayReport(run_id=uuid.uuid4().hex[:8]))
                run.task = asyncio.create_task(
                    replay(ctx.reader, ctx.bus, body.filter, rate=body.rate, pace=pace, report=run.report)
                )
                ctx.remember(run)
                return JSONResponse(run.as_dict(), status_code=202)
            report = await replay(
                ctx.reader, ctx.bus, body.filter, rate=body.rate, pace=pace, dry_run=body.dry_run
            )
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"msg": str(exc), "loc": ()}
            where = ".".join(str(p) for p in first.get("loc", ()))
            return _error(400, "invalid_filter", f"{first['msg']}" + (f" at {where}" if where else ""))
        except ReplayFilterError as exc:
            return _error(400, "invalid_filter", str(exc))
        except EventLogError as exc:
            return _error(503, "event_log_unavailable", str(exc))
        except BusError as exc:
            return _error(503, "bus_unavailable", str(exc))
        return JSONResponse(report.as_dict())

    @router.get("/replay/{run_id}", dependencies=[Depends(admin_only)])
    async def replay_progress(run_id: str) -> JSONResponse:
        run = ctx.replays.get(run_id)
        if run is None:
            return _error(404, "not_found", f"no paced replay {run_id!r} in this stack")
        return JSONResponse(run.as_dict())

    @router.post("/trainer/{action}", dependencies=[Depends(admin_only)])
    async def trainer_route(action: str, request: Request) -> JSONResponse:
        """The trainer's one pause channel, for a stack whose bus lives in its own process."""
        if action not in ("pause", "resume"):
            return _error(404, "not_found", f"no trainer action {action!r} (pause, resume)")
        try:
            body = PauseRequest.model_validate_json(await request.body() or b"{}")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            return _error(400, "invalid_request", f"{first['msg']}" + (f" at {where}" if where else ""))
        event = (
            TrainerPauseRequested(model=body.model, reason=body.reason, producer="ops-api")
            if action == "pause"
            else TrainerResumeRequested(model=body.model, producer="ops-api")
        )
        try:
            await ctx.bus.publish(CONTROL, event)
        except BusError as exc:
            return _error(503, "bus_unavailable", str(exc))
        return JSONResponse(event.model_dump(mode="json"))

    return router
