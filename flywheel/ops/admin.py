"""A small client for a running Flywheel process's admin HTTP API (a gateway, or ``flywheel up``).

Errors:
    AdminError
     ├── AdminUnreachableError   nothing answers at the URL (or it timed out)
     └── AdminRefusedError       it answered with an error status (401: wrong admin token)
"""

from __future__ import annotations

from typing import Any

import httpx


class AdminError(Exception):
    pass


class AdminUnreachableError(AdminError):
    pass


class AdminRefusedError(AdminError):
    def __init__(self, url: str, status: int, detail: str) -> None:
        hint = " (wrong or missing FLYWHEEL_ADMIN_TOKEN)" if status in (401, 403) else ""
        super().__init__(f"{url} answered {status}{hint}: {detail[:300]}")
        self.status = status


class AdminClient:
    def __init__(self, base_url: str, token: str, *, timeout_s: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout_s

    async def request(self, method: str, path: str, json: Any = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                response = await client.request(method, url, json=json, headers=self._headers)
        except httpx.HTTPError as exc:
            raise AdminUnreachableError(f"cannot reach {url}: {type(exc).__name__}: {exc}") from exc
        if response.status_code >= 400:
            raise AdminRefusedError(url, response.status_code, _detail(response))
        try:
            return response.json()
        except ValueError as exc:
            raise AdminError(f"{url} did not answer JSON") from exc

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def post(self, path: str, json: Any = None) -> Any:
        return await self.request("POST", path, json=json)


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip().replace("\n", " ")
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body["error"]))
    return str(body)
