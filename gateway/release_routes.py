"""The admin routes of releases (gateway/releases.py): list, show, promote, roll back, pin.

    GET  /admin/versions                      the release book: every policy's served version and versions
    GET  /admin/versions/{version}?adapter=A  one version: its status, weights and evaluation
    POST /admin/versions/promote   {"version", "adapter", "by", "reason"}
    POST /admin/versions/rollback  {"adapter", "by", "reason"}
    POST /admin/versions/pin       {"version" (null: unpin), "adapter", "by", "reason"}
    POST /admin/versions/canary    {"version", "share" (in (0, 1)), "adapter", "by", "reason"}

A request is checked against the book first (``infra/releases.py``): an unknown version is a 404, one
that failed its gates, a rollback with nothing to roll back to or a pinned policy a 409, a canary share
outside (0, 1) a 400, and nothing
changes. A request that passes is published on ``flywheel.control`` (every gateway, the event log) and
applied here before the answer, so the next production call is served by the version it names.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from gateway.errors import ConflictError, InvalidRequestError, NotFoundError
from gateway.releases import ReleaseRouter
from gateway.service import Gateway
from infra.http import require_admin
from infra.releases import InvalidReleaseRequest, ReleaseError, UnknownVersionError
from schemas import VersionCanary, VersionPinned, VersionPromoted, VersionRolledBack

_MAX = 2**31 - 1


class _Decision(BaseModel):
    model_config = ConfigDict(extra="forbid")

    adapter: str | None = Field(default=None, min_length=1, max_length=128)
    by: str = Field(default="admin", min_length=1, max_length=256)
    reason: str = Field(default="", max_length=1024)


class PromoteRequest(_Decision):
    version: int = Field(ge=0, le=_MAX)


class RollbackRequest(_Decision):
    pass


class PinRequest(_Decision):
    version: int | None = Field(ge=0, le=_MAX)


class CanaryRequest(_Decision):
    version: int = Field(ge=0, le=_MAX)
    share: float = Field(allow_inf_nan=False)


def _json(data: Any) -> Response:
    return Response(orjson.dumps(data), media_type="application/json")


def _router_of(request: Request) -> tuple[Gateway, ReleaseRouter]:
    gw: Gateway = request.app.state.gateway
    require_admin(request, gw.settings.admin_token.get_secret_value())
    if gw.releases is None:
        raise NotFoundError(  # nothing to find here: a 4xx, as for any route a gateway does not serve
            "releases are off on this gateway (FLYWHEEL_RELEASES=gated turns them on)",
            code="releases_off",
        )
    return gw, gw.releases


async def _carry_out(gw: Gateway, releases: ReleaseRouter, plan: Any, adapter: str | None) -> Response:
    try:
        event: VersionPromoted | VersionRolledBack | VersionPinned | VersionCanary = plan()
    except UnknownVersionError as exc:
        raise NotFoundError(str(exc), code="unknown_version") from None
    except InvalidReleaseRequest as exc:
        raise InvalidRequestError(str(exc), code="invalid_release_request", param="share") from None
    except ReleaseError as exc:
        raise ConflictError(str(exc), code="release_refused") from None
    await gw.publish(event)
    await releases.apply(event)
    return _json(
        {"event": event.model_dump(mode="json"), "release": releases.book.release(adapter).as_json()}
    )


def release_routes(router: APIRouter) -> None:
    """Add the routes above to ``router``."""

    @router.get("/admin/versions", tags=["admin"])
    async def versions(request: Request) -> Response:
        _, releases = _router_of(request)
        return _json(releases.book.as_json())

    @router.get("/admin/versions/{version}", tags=["admin"])
    async def version_(request: Request, version: int, adapter: str | None = None) -> Response:
        _, releases = _router_of(request)
        rel = releases.book.release(adapter)
        if rel.record(version) is None and version != rel.served:
            raise NotFoundError(f"{rel.name}: version {version} is unknown", code="unknown_version")
        return _json({"policy": rel.name, **rel.version_json(version)})

    @router.post("/admin/versions/promote", tags=["admin"])
    async def promote(request: Request, body: PromoteRequest) -> Response:
        gw, releases = _router_of(request)
        book = releases.book
        return await _carry_out(
            gw,
            releases,
            lambda: book.plan_promote(body.version, adapter=body.adapter, by=body.by, reason=body.reason),
            body.adapter,
        )

    @router.post("/admin/versions/rollback", tags=["admin"])
    async def rollback(request: Request, body: RollbackRequest) -> Response:
        gw, releases = _router_of(request)
        book = releases.book
        return await _carry_out(
            gw,
            releases,
            lambda: book.plan_rollback(adapter=body.adapter, by=body.by, reason=body.reason),
            body.adapter,
        )

    @router.post("/admin/versions/pin", tags=["admin"])
    async def pin(request: Request, body: PinRequest) -> Response:
        gw, releases = _router_of(request)
        book = releases.book
        return await _carry_out(
            gw,
            releases,
            lambda: book.plan_pin(body.version, adapter=body.adapter, by=body.by, reason=body.reason),
            body.adapter,
        )

    @router.post("/admin/versions/canary", tags=["admin"])
    async def canary(request: Request, body: CanaryRequest) -> Response:
        gw, releases = _router_of(request)
        book = releases.book
        return await _carry_out(
            gw,
            releases,
            lambda: book.plan_canary(
                body.version, body.share, adapter=body.adapter, by=body.by, reason=body.reason
            ),
            body.adapter,
        )
