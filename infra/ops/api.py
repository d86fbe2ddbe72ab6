"""The ops admin API of a running embedded stack: status and replay, which need its in-process bus.

Mounted by whoever owns the bus (``flywheel up``):
``app.include_router(create_ops_router(OpsContext(...)))``. Every route needs
``Authorization: Bearer <FLYWHEEL_ADMIN_TOKEN>``; errors are OpenAI-shaped.

    GET  /admin/ops/status   → StatusReport (services, lag per topic, gateway, weights, trainer step)
    POST /admin/ops/replay   {"filter": ReplayFilter, "rate": N | null, "dry_run": bool} → ReplayReport
"""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from infra.bus.base import Bus, BusError, Subscription
from infra.eventlog.errors import EventLogError
from infra.ops.status import ControlState, StatusReport, topic_lags
from infra.replay import ReplayFilter, ReplayFilterError, ScoredEpisodeSource, replay
from schemas import CONTROL

PREFIX = "/admin/ops"


class ReplayRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    filter: ReplayFilter = Field(default_factory=ReplayFilter)
    rate: float | None = Field(default=None, gt=0)
    dry_run: bool = False


@dataclass
class OpsContext:
    """What the routes read: the stack's bus and event log, and how to ask its parts for their state."""

    bus: Bus
    reader: ScoredEpisodeSource
    admin_token: str
    services: Callable[[], dict[str, dict[str, Any]]] = dict
    gateway_state: Callable[[], dict[str, Any] | None] = lambda: None
    control: ControlState = field(default_factory=ControlState)
    _sub: Subscription | None = None

    async def watch_control(self) -> None:
        """Follow the control topic (weights, trainer steps) for the status report."""
        await self.bus.ensure_topics([CONTROL])
        group = f"ops-status-{uuid.uuid4().hex[:12]}"
        self._sub = await self.bus.subscribe(CONTROL, group, self.control.handle, from_beginning=True)

    async def stop(self) -> None:
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
    kind = "authentication_error" if status == 401 else "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": code, "param": None}}, status)


def create_ops_router(ctx: OpsContext) -> APIRouter:
    router = APIRouter(prefix=PREFIX, tags=["admin"])

    def authorized(request: Request) -> bool:
        header = request.headers.get("authorization", "")
        token = (
            header[7:] if header.lower().startswith("bearer ") else request.headers.get("x-admin-token", "")
        )
        return bool(ctx.admin_token) and hmac.compare_digest(token.encode(), ctx.admin_token.encode())

    @router.get("/status")
    async def status(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "invalid_admin_token", "admin token required")
        return JSONResponse((await ctx.status()).as_dict())

    @router.post("/replay")
    async def replay_route(request: Request) -> JSONResponse:
        if not authorized(request):
            return _error(401, "invalid_admin_token", "admin token required")
        try:
            body = ReplayRequest.model_validate_json(await request.body())
            report = await replay(ctx.reader, ctx.bus, body.filter, rate=body.rate, dry_run=body.dry_run)
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

    return router
