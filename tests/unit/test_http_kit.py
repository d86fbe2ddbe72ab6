"""The HTTP kit (``infra.http``): one bearer check and one error shape for every API."""

from __future__ import annotations

import httpx
import pytest
from fastapi import Depends, FastAPI, Request
from pydantic import BaseModel

from infra.http import (
    HttpError,
    bearer_token,
    install_error_handlers,
    require_admin_token,
    token_matches,
)

pytestmark = pytest.mark.timeout(30)


def test_bearer_token_reads_the_scheme_in_any_case_and_a_named_fallback() -> None:
    assert bearer_token({"authorization": "Bearer abc "}) == "abc"
    assert bearer_token({"authorization": "bearer abc"}) == "abc"
    assert bearer_token({"authorization": "Basic abc"}) == ""
    assert bearer_token({"authorization": "Bearer "}) == ""
    assert bearer_token({"x-api-key": "k"}) == ""
    assert bearer_token({"x-api-key": "k"}, "x-api-key") == "k"
    assert bearer_token({"authorization": "Bearer a", "x-api-key": "k"}, "x-api-key") == "a"


def test_an_empty_expected_token_matches_nothing() -> None:
    assert token_matches("s3cret", "s3cret")
    assert not token_matches("s3cre", "s3cret")
    assert not token_matches("", "")


class Body(BaseModel):
    n: int


def _app() -> FastAPI:
    app = FastAPI()
    install_error_handlers(app, unexpected="internal test error")

    def admin(request: Request) -> None:
        require_admin_token(request.headers, "tok")

    @app.post("/admin", dependencies=[Depends(admin)])
    async def admin_route(body: Body) -> dict[str, int]:
        return {"n": body.n}

    @app.get("/conflict")
    async def conflict() -> None:
        raise HttpError(
            "taken", status_code=409, error_type="invalid_request_error", code="taken", param="id"
        )

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("secret internals")

    return app


async def test_every_error_is_an_openai_error_body() -> None:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://kit") as client:
        ok = await client.post("/admin", json={"n": 1}, headers={"X-Admin-Token": "tok"})
        assert ok.status_code == 200 and ok.json() == {"n": 1}
        answers = {
            "no token": await client.post("/admin", json={"n": 1}),
            "wrong token": await client.post("/admin", json={"n": 1}, headers={"Authorization": "Bearer x"}),
            "not json": await client.post(
                "/admin",
                content=b"{",
                headers={"Authorization": "Bearer tok", "Content-Type": "application/json"},
            ),
            "wrong field": await client.post(
                "/admin", json={"n": "x"}, headers={"Authorization": "Bearer tok"}
            ),
            "raised": await client.get("/conflict"),
            "unknown path": await client.get("/nowhere"),
            "unexpected": await client.get("/boom"),
        }
    statuses = {name: r.status_code for name, r in answers.items()}
    assert statuses == {
        "no token": 401,
        "wrong token": 401,
        "not json": 400,
        "wrong field": 422,
        "raised": 409,
        "unknown path": 404,
        "unexpected": 500,
    }
    errors = {name: r.json()["error"] for name, r in answers.items()}
    assert all(set(e) == {"message", "type", "param", "code"} for e in errors.values()), errors
    assert errors["no token"]["code"] == "invalid_admin_token"
    assert errors["no token"]["type"] == "authentication_error"
    assert errors["wrong field"]["param"] == "n"
    assert errors["raised"] == {
        "message": "taken",
        "type": "invalid_request_error",
        "param": "id",
        "code": "taken",
    }
    assert errors["unknown path"]["type"] == "not_found_error"
    assert errors["unexpected"]["message"] == "internal test error"
    assert "secret" not in answers["unexpected"].text
